"""RFC 9457 problem details: the one shape of every error the API answers.

Every error, from an unknown route to a refused admission, leaves as
``application/problem+json`` with ``type``, ``title``, ``status``, ``detail`` and, where it
helps a program decide what to do, extra members (``limit``, ``retry_after``, ``task_id``...).
``type`` is ``urn:floodway:problem:<slug>``: stable names clients can switch on without
pretending to be a resolvable documentation URL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from floodway.core.errors import ConfigError, FloodwayError, Unavailable
from floodway.wire.openai import openai_error
from floodway.wire.problems import HTTP_SLUGS, TYPE_PREFIX, render

log = logging.getLogger("floodway.api")

PROBLEM_JSON = "application/problem+json"
#: the OpenAI-compatible routes: their problems also carry OpenAI's ``error`` member
OPENAI_PREFIX = "/openai/"


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


class Problem(BaseModel):
    """An RFC 9457 problem document; extension members vary by ``type``."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="urn:floodway:problem:<slug>, stable for programs")
    title: str
    status: int
    detail: str = ""
    instance: str | None = None


class ApiProblem(Exception):
    """Raised by routes and dependencies for errors that are not floodway domain errors."""

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        title: str | None = None,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status, self.slug, self.detail = status, slug, detail
        self.title = title or _phrase(status)
        self.headers = dict(headers or {})
        self.extra = extra


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_JSON

    def render(self, content: Any) -> bytes:
        # ASCII escapes: a problem may quote what the caller sent, which may not be valid
        # Unicode (a lone surrogate), and an error about bad input must never fail itself.
        return json.dumps(
            content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode()


def problem_response(
    status: int,
    slug: str,
    detail: str,
    *,
    title: str | None = None,
    headers: Mapping[str, str] | None = None,
    instance: str | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": TYPE_PREFIX + slug,
        "title": title or _phrase(status),
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    body.update(extra)
    if instance is not None and instance.startswith(OPENAI_PREFIX):
        # OpenAI's error object as an extension member: the official SDKs read it, while the
        # document stays a problem like every other error of the API.
        body["error"] = openai_error(status, extra.get("code") or slug, detail, extra.get("param"))
    return ProblemResponse(body, status_code=status, headers=dict(headers or {}))


def problem_bytes(
    status: int, slug: str, detail: str, instance: str | None = None, **extra: Any
) -> bytes:
    """The body of a problem, for middleware that answers before any route runs."""
    response = problem_response(status, slug, detail, instance=instance, **extra)
    return bytes(response.body)


def from_floodway_error(exc: FloodwayError, instance: str | None = None) -> JSONResponse:
    """A floodway error as the problem its row in :mod:`floodway.wire.problems` says."""
    rendered = render(exc)
    if rendered is None:
        if isinstance(exc, ConfigError):
            log.error("configuration error while serving: %s", exc)
        else:
            log.error("unmapped floodway error: %r", exc)
        return problem_response(500, "internal-error", "internal error", instance=instance)
    if isinstance(exc, Unavailable):  # an outage: the same request later may succeed
        log.error("%s: %s", rendered.slug, exc)
    return problem_response(
        rendered.status,
        rendered.slug,
        rendered.detail,
        title=rendered.title,
        instance=instance,
        headers=rendered.headers,
        **rendered.members,
    )


def install_problem_handlers(app: FastAPI) -> None:
    """Every error the framework or floodway raises inside a route becomes a problem."""

    async def on_api_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiProblem)
        return problem_response(
            exc.status,
            exc.slug,
            exc.detail,
            title=exc.title,
            headers=exc.headers,
            instance=request.url.path,
            **exc.extra,
        )

    async def on_floodway(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, FloodwayError)
        return from_floodway_error(exc, instance=request.url.path)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        detail = exc.detail if isinstance(exc.detail, str) else _phrase(status)
        if status == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}"
        headers = dict(exc.headers or {})
        if status == 405:
            if detail == "Method Not Allowed":
                detail = f"{request.method} is not allowed on {request.url.path}"
            # Starlette names the methods of the first route on the path only; a path served
            # by several routes (GET and POST /v1/tasks) must list them all.
            allowed = allowed_methods(app, request.scope)
            if allowed:
                headers["Allow"] = ", ".join(allowed)
        return problem_response(
            status,
            HTTP_SLUGS.get(status, "http-error"),
            detail,
            headers=headers,
            instance=request.url.path,
        )

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = [_clean_error(e) for e in exc.errors()]
        if any(e["type"] == "json_invalid" for e in errors):
            return problem_response(
                400,
                "malformed-json",
                "the request body is not valid JSON",
                instance=request.url.path,
                errors=errors,
            )
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        detail = f"{where}: {first['msg']}" if where else str(first["msg"])
        return problem_response(
            422, "validation-error", detail, instance=request.url.path, errors=errors
        )

    app.add_exception_handler(ApiProblem, on_api_problem)
    app.add_exception_handler(FloodwayError, on_floodway)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods some route serves on this path, asked of the router itself (routers may
    nest, so walking routes by hand would miss some)."""
    allowed = []
    for method in _METHODS:
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] is Match.FULL for route in app.router.routes):
            allowed.append(method)
    return allowed


def _clean_error(error: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only what is JSON and safe to echo: pydantic's ``input``/``ctx`` can hold any
    object (and the caller's own data), which must never turn a 422 into a 500."""
    loc = [p if isinstance(p, int | str) else str(p) for p in error.get("loc", ())]
    return {"loc": loc, "msg": str(error.get("msg", "")), "type": str(error.get("type", ""))}


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
