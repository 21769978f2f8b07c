"""Direct routes: the hottest requests answered without FastAPI's per-request machinery.

FastAPI resolves a route's parameters and dependencies on every request by walking their
declarations (on ``POST /v1/tasks`` that walk cost as much CPU as the submit itself), then
runs the request through its exception middleware, an exit stack and its router. A direct
route keeps its FastAPI declaration (the OpenAPI document, 405s and the rest come from it as
before), but :class:`DirectRoutes` hands its requests to a handler that reads the same headers
and body itself, with the same checks in the same order and the same errors, then calls the
declared endpoint; errors go to the app's own exception handlers, as inside FastAPI.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import TypeAdapter, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from floodway.api.media import is_json_media_type

T = TypeVar("T")
Handler = Callable[[Request], Coroutine[Any, Any, Response]]
#: an app's exception handler, as Starlette takes them
OnError = Callable[[Request, Any], Response | Awaitable[Response]]


class DirectRoutes:
    """Pure ASGI, inside the guard (bodies already bounded): ``(method, path)`` pairs answered
    by their handler; anything else passes to the app."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        routes: Mapping[tuple[str, str], Handler],
        exception_handlers: Mapping[Any, OnError],
    ) -> None:
        self.app = app
        self.routes = dict(routes)
        #: the app's dict itself: handlers added after this middleware count too
        self.exception_handlers = exception_handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = None
        if scope["type"] == "http" and not scope.get("root_path"):
            handler = self.routes.get((scope["method"], scope["path"]))
        if handler is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
        except Exception as exc:
            on_error = self._handler_for(exc)
            if on_error is None:
                raise  # the guard answers it with a 500 problem, as for any route
            answer = on_error(request, exc)
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> OnError | None:
        for cls in type(exc).__mro__:  # the nearest class first, as Starlette looks them up
            if cls in self.exception_handlers:
                return self.exception_handlers[cls]
        return None


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
