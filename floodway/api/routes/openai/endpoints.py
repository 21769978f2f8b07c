"""``/openai/v1``: chat completions, embeddings, image generations and the model list, as the
official OpenAI SDKs call them (``base_url=".../openai/v1"``, the floodway API key as the
SDK's ``api_key``). Each call is a floodway task (see :mod:`.calls`)."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import StringConstraints, TypeAdapter

from floodway.api.auth import Tenant, caller_of
from floodway.api.direct import Handler, validate
from floodway.api.media import JSON_BODY, require_json
from floodway.api.problems import ApiProblem
from floodway.api.routes.openai import responses
from floodway.api.routes.openai.calls import await_call, is_retry, submit_call, wait_budget
from floodway.api.routes.openai.catalog import json_object, kind_for, served
from floodway.api.routes.openai.responses import refuse_chat_only
from floodway.api.routes.openai.streams import stream_call
from floodway.api.state import ApiState, api_state
from floodway.wire.openai import ENDPOINT_PATHS

router = APIRouter()

State = Annotated[ApiState, Depends(api_state)]
KEY_HEADER = "Idempotency-Key"
IdempotencyKey = Annotated[str | None, Header(alias=KEY_HEADER, max_length=255)]
_KEY = TypeAdapter(Annotated[str, StringConstraints(max_length=255)])
#: the OpenAI routes' prefix (floodway.api.routes.openai.PREFIX, which includes this module)
PREFIX = "/openai/v1"


async def _call(
    endpoint: str, request: Request, tenant: str, state: ApiState, key: str | None
) -> Response:
    body = await json_object(request)
    if endpoint == "responses":
        refuse_chat_only(state, body)
        kind = kind_for(state.settings, endpoint, body)
        return await responses.create(state, request, tenant, kind, body, key or None)
    kind = kind_for(state.settings, endpoint, body)
    streamed = body.get("stream") is True
    if streamed and endpoint != "chat":
        raise ApiProblem(400, "stream-unsupported", f"{endpoint} has no stream", param="stream")
    task = await submit_call(
        state, tenant, kind, body, key or None, retry=is_retry(request.headers)
    )
    if streamed:
        return await stream_call(state, task, body)
    left = None if task.deadline_at is None else task.deadline_at - state.fw.clock.now()
    return await await_call(state, task, wait_budget(request.headers, left))


async def _direct(endpoint: str, request: Request) -> Response:
    """A call as FastAPI would answer its declaration below, without its per-request
    machinery (:mod:`floodway.api.direct`): the JSON check (415), the caller (401), the
    Idempotency-Key header (422), then the call."""
    await require_json(request)
    who = await caller_of(request)
    errors: list[dict[str, Any]] = []
    sent = request.headers.get(KEY_HEADER)
    key = None if sent is None else validate(_KEY, sent, ("header", KEY_HEADER), errors)
    if errors:
        raise RequestValidationError(errors)
    return await _call(endpoint, request, who.tenant, await api_state(request), key)


#: answered by floodway.api.direct.DirectRoutes, ahead of FastAPI's router
DIRECT: dict[tuple[str, str], Handler] = {
    ("POST", PREFIX + path): partial(_direct, endpoint) for endpoint, path in ENDPOINT_PATHS.items()
}


@router.post("/chat/completions", dependencies=[JSON_BODY])
async def chat_completions(
    request: Request, tenant: Tenant, state: State, key: IdempotencyKey = None
) -> Response:
    return await _call("chat", request, tenant, state, key)


@router.post("/embeddings", dependencies=[JSON_BODY])
async def embeddings(
    request: Request, tenant: Tenant, state: State, key: IdempotencyKey = None
) -> Response:
    return await _call("embeddings", request, tenant, state, key)


@router.post("/responses", dependencies=[JSON_BODY])
async def create_response(
    request: Request, tenant: Tenant, state: State, key: IdempotencyKey = None
) -> Response:
    return await _call("responses", request, tenant, state, key)


@router.post("/images/generations", dependencies=[JSON_BODY])
async def images(
    request: Request, tenant: Tenant, state: State, key: IdempotencyKey = None
) -> Response:
    return await _call("images", request, tenant, state, key)


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "floodway"}


@router.get("/models")
async def models(tenant: Tenant, state: State) -> dict[str, Any]:
    names = sorted({model for (_, model) in served(state.settings)})
    return {"object": "list", "data": [_model(n) for n in names]}


@router.get("/models/{model:path}")
async def model(model: str, tenant: Tenant, state: State) -> dict[str, Any]:
    if model not in {m for (_, m) in served(state.settings)}:
        raise ApiProblem(404, "model-not-found", f"no kind serves model {model[:200]!r}")
    return _model(model)
