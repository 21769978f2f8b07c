"""Which kind serves a request: its endpoint and its ``model`` (kinds with ``adapter =
"openai"`` declare the models they serve), and reading an OpenAI request body."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from floodway.api.problems import ApiProblem
from floodway.config import Settings
from floodway.wire.tasks import valid_unicode


def served(settings: Settings) -> dict[tuple[str, str], str]:
    """(endpoint, model) -> the kind that serves it (the settings forbid two)."""
    return {
        (kind.endpoint, model): name
        for name, kind in settings.kinds.items()
        for model in kind.served_models
    }


def kind_for(settings: Settings, endpoint: str, body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiProblem(400, "model-missing", "the body must name a model", param="model")
    kind = served(settings).get((endpoint, model))
    if kind is None:
        known = sorted(m for (e, m) in served(settings) if e == endpoint)
        raise ApiProblem(
            404,
            "model-not-found",
            f"no kind serves model {model[:200]!r} on {endpoint} (served here: "
            f'{", ".join(known) or "none"}; a kind with adapter = "openai" lists its models)',
            param="model",
        )
    return kind


async def json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise ApiProblem(400, "malformed-json", "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiProblem(400, "invalid-body", "the request body must be a JSON object")
    if not valid_unicode(body):  # "\ud800" is JSON syntax, but no text
        raise ApiProblem(400, "invalid-body", "the body holds a lone surrogate: not Unicode text")
    return body
