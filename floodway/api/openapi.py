"""The OpenAPI document: every error response is documented as ``application/problem+json``.

Routes declare which problems they can answer with :func:`problems`; FastAPI would file those
(and its own 422) under ``application/json``, so :func:`install_openapi` rewrites every 4xx/5xx
to the problem media type and the one ``Problem`` schema.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from floodway.api.media import JSON_BODY
from floodway.api.problems import PROBLEM_JSON, Problem

_DESCRIPTIONS = {
    400: "Malformed JSON, or JSON nested too deep",
    402: "The submission's estimated cost would pass the tenant's budget this period",
    401: "Missing or unknown API key (when keys are configured), or a bad webhook signature",
    404: "No such task for this tenant, or no such route",
    408: "The request body did not arrive within [api] body_timeout",
    409: "Conflicting state (Idempotency-Key reused with another body, illegal transition)",
    413: "Request body larger than [api] max_body_bytes",
    415: "A body that is not sent as Content-Type: application/json",
    422: "Invalid request (unknown kind, bad input, bad parameters)",
    429: "Admission refused (submit rate or interactive depth); see Retry-After",
    500: "Internal error",
    503: "The task ledger is unavailable",
}

#: what any route can answer: its body is read and checked before routing, and bugs are
#: possible
_ALWAYS = (400, 408, 413, 500, 503)


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entries for the problems a route can answer."""
    return {
        code: {"model": Problem, "description": _DESCRIPTIONS.get(code, "Error")}
        for code in sorted({*codes, *_ALWAYS})
    }


def submit_route(model: type[BaseModel], summary: str, replay: str) -> dict[str, Any]:
    """What a submit route declares: 202 with ``model``, the same with 200 when the
    Idempotency-Key replays ``replay``, a JSON body, and the problems a submit answers."""
    return {
        "status_code": 202,
        "response_model": model,
        "summary": summary,
        "dependencies": [JSON_BODY],
        "responses": {
            200: {"model": model, "description": f"Idempotency-Key replay: {replay}"},
            **problems(401, 402, 409, 415, 422, 429),
        },
    }


def _drop_null(parameter: dict[str, Any]) -> None:
    """A query or header parameter is absent or a string, never JSON ``null``: FastAPI's
    ``anyOf: [T, null]`` for optional parameters says something a URL cannot carry."""
    schema = parameter.get("schema", {})
    options = schema.get("anyOf")
    if not isinstance(options, list):
        return
    kept = [o for o in options if o != {"type": "null"}]
    if len(kept) == 1 and len(kept) < len(options):
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        parameter["schema"] = {**kept[0], **rest}


def install_openapi(app: FastAPI, kinds: Callable[[], Sequence[str]] | None = None) -> None:
    """``kinds``: the declared kind names, listed as the ``kind`` enum of a submit (the document
    is built on first request, after the lifespan opened the ledger and loaded config kinds)."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        ref = {"$ref": "#/components/schemas/Problem"}
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        components.setdefault("Problem", Problem.model_json_schema())
        for path_item in doc.get("paths", {}).values():
            for operation in path_item.values():
                if not isinstance(operation, dict):
                    continue
                for parameter in operation.get("parameters", []):
                    _drop_null(parameter)
                for code, response in operation.get("responses", {}).items():
                    if not str(code).isdigit() or int(code) < 400:
                        continue
                    response["content"] = {PROBLEM_JSON: {"schema": ref}}
                    if int(code) in _DESCRIPTIONS:
                        response["description"] = _DESCRIPTIONS[int(code)]
                    if int(code) in (429, 503):
                        response["headers"] = {
                            "Retry-After": {
                                "description": "Seconds to wait before trying again",
                                "schema": {"type": "integer"},
                            }
                        }
        names = sorted(kinds()) if kinds is not None else []
        submit = components.get("SubmitIn", {}).get("properties", {}).get("kind")
        if names and submit is not None:
            submit["enum"] = names
        # FastAPI's own validation-error schemas are no longer referenced.
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = doc
        return doc

    app.openapi = build  # type: ignore[method-assign]
