"""Routes that run without FastAPI's per-request dependency solving, for the hottest paths.

FastAPI resolves a route's parameters and dependencies on every request by walking their
declarations; on ``POST /v1/tasks`` that walk cost as much CPU as the submit itself. A direct
route keeps the FastAPI declaration (the OpenAPI document is generated from it as before) but
answers with a handler that reads the same headers and body itself, with the same checks in
the same order and the same errors, then calls the declared endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError

from floodway.api.media import is_json_media_type

T = TypeVar("T")
Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def direct_route(handler: Handler) -> type[APIRoute]:
    """A route class whose requests go to ``handler`` instead of FastAPI's request handler."""

    class DirectRoute(APIRoute):
        def get_route_handler(self) -> Handler:
            return handler

    return DirectRoute


class _Empty:
    """No body at all (JSON ``null`` is a body, and fails validation differently)."""


EMPTY = _Empty()


async def json_payload(request: Request) -> Any:
    """The body parsed as FastAPI parses it: EMPTY when there is none, left unparsed when it
    is not declared JSON (the 415 check answers that), a malformed one raising its 400.

    The standard library's parser, as FastAPI's: orjson would be a few microseconds faster on
    a small body but turns an integer beyond 64 bits into a float, changing the input."""
    raw = await request.body()
    if not raw:
        return EMPTY
    if not is_json_media_type(request.headers.get("content-type")):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error"}]
        ) from exc
    except ValueError as exc:  # not text in any encoding JSON allows
        raise HTTPException(400, "There was an error parsing the body") from exc


def validate(
    adapter: TypeAdapter[T], value: Any, loc: tuple[str | int, ...], errors: list[dict[str, Any]]
) -> T | None:
    """``value`` checked by ``adapter`` as FastAPI checks a parameter; a failure adds
    FastAPI-shaped errors to ``errors``."""
    try:
        return adapter.validate_python(value, from_attributes=True)
    except ValidationError as exc:
        errors.extend({**e, "loc": (*loc, *e["loc"])} for e in exc.errors(include_url=False))
        return None


def body_value(adapter: TypeAdapter[T], payload: Any, errors: list[dict[str, Any]]) -> T | None:
    """The body validated as FastAPI validates a required body parameter."""
    if payload is EMPTY:
        errors.append({"type": "missing", "loc": ("body",), "msg": "Field required", "input": None})
        return None
    return validate(adapter, payload, ("body",), errors)
