"""``POST /v1/embeddings``: four numbers per input that depend on its text only."""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from floodway.providers.sim.model import Job
from floodway.providers.sim.openai.calls import BadRequest, OpenAISimulator, model_of, read_body
from floodway.providers.sim.openai.wire import json_response, tokens_of


def routes(sim: OpenAISimulator) -> list[Route]:
    return [Route("/v1/embeddings", partial(create, sim), methods=["POST"])]


def vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 255 for b in digest[:4]]


def whole_embedding(body: dict[str, Any], _call_id: str) -> dict[str, Any]:
    """The answer to a (valid) embeddings request: a batch line's."""
    given = body.get("input")
    texts = [str(t) for t in ([given] if isinstance(given, str) else given or [])]
    return _answer(texts, str(body.get("model")))


def _answer(texts: list[str], model: str) -> dict[str, Any]:
    tokens = sum(tokens_of(t) for t in texts)
    data = [
        {"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(texts)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


async def create(sim: OpenAISimulator, request: Request) -> Response:
    try:
        body = await read_body(request)
        model = model_of(body)
        given = body.get("input")
        texts = [given] if isinstance(given, str) else given
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise BadRequest("input", "input must be a string or a non-empty array of strings")
    except BadRequest as exc:
        return exc.response()
    tokens = sum(tokens_of(t) for t in texts)

    async def answer(job: Job) -> Response:
        whole = _answer(texts, model)
        sim.bill(job, tokens, whole)
        return json_response(whole)

    return await sim.call(request.headers.get("idempotency-key"), body, tokens, answer)
