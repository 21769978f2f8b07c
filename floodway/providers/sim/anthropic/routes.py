"""The routes of the Anthropic simulator: ``POST /v1/messages`` and the Message Batches API
(create, retrieve, list newest first, cancel, results)."""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from floodway.providers.sim.anthropic.calls import AnthropicSimulator
from floodway.providers.sim.anthropic.desk import MAX_REQUESTS, MessageBatch
from floodway.providers.sim.anthropic.wire import check, error
from floodway.providers.sim.openai.wire import json_response

#: Anthropic's rule for a request's custom_id
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def routes(sim: AnthropicSimulator) -> list[Route]:
    return [
        Route("/v1/messages", partial(create_message, sim), methods=["POST"]),
        Route("/v1/messages/batches", partial(create_batch, sim), methods=["POST"]),
        Route("/v1/messages/batches", partial(list_batches, sim), methods=["GET"]),
        Route("/v1/messages/batches/{batch_id}", partial(retrieve, sim), methods=["GET"]),
        Route("/v1/messages/batches/{batch_id}/cancel", partial(cancel, sim), methods=["POST"]),
        Route("/v1/messages/batches/{batch_id}/results", partial(results, sim), methods=["GET"]),
    ]


async def _body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (ValueError, RecursionError):
        return None


async def create_message(sim: AnthropicSimulator, request: Request) -> Response:
    if (refused := sim.refused(request)) is not None:
        return refused
    body = await _body(request)
    if (why := check(body)) is not None:
        return error("invalid_request_error", why)
    if body.get("stream") is True:
        return error("invalid_request_error", "the simulator does not stream")
    return await sim.call(body)


def _requests_problem(body: Any) -> str | None:
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not 1 <= len(requests) <= MAX_REQUESTS:
        return f"requests: 1 to {MAX_REQUESTS} requests are required"
    ids = [r.get("custom_id") if isinstance(r, dict) else None for r in requests]
    if not all(isinstance(i, str) and CUSTOM_ID.match(i) for i in ids):
        return "requests: each needs a custom_id of 1 to 64 letters, digits, _ or -"
    if len(set(ids)) != len(ids):
        return "requests: custom_id must be unique within a batch"
    if not all(isinstance(r.get("params"), dict) for r in requests):
        return "requests: each needs its params (a Messages request)"
    return None


async def create_batch(sim: AnthropicSimulator, request: Request) -> Response:
    if (refused := sim.refused(request)) is not None:
        return refused
    body = await _body(request)
    if (why := _requests_problem(body)) is not None:
        return error("invalid_request_error", why)
    batch = sim.batches.create(body["requests"])
    return json_response(batch.as_dict(str(request.base_url)))


def _batch(sim: AnthropicSimulator, request: Request) -> MessageBatch | None:
    batch = sim.batches.batches.get(request.path_params["batch_id"])
    if batch is not None:
        sim.batches.advance(batch)
    return batch


def _not_found(request: Request) -> Response:
    return error("not_found_error", f"No such batch: {request.path_params['batch_id']}")


async def retrieve(sim: AnthropicSimulator, request: Request) -> Response:
    if (refused := sim.refused(request)) is not None:
        return refused
    batch = _batch(sim, request)
    if batch is None:
        return _not_found(request)
    return json_response(batch.as_dict(str(request.base_url)))


async def cancel(sim: AnthropicSimulator, request: Request) -> Response:
    if (refused := sim.refused(request)) is not None:
        return refused
    batch = _batch(sim, request)
    if batch is None:
        return _not_found(request)
    sim.batches.cancel(batch)
    return json_response(batch.as_dict(str(request.base_url)))


async def results(sim: AnthropicSimulator, request: Request) -> Response:
    if (refused := sim.refused(request)) is not None:
        return refused
    batch = _batch(sim, request)
    if batch is None:
        return _not_found(request)
    if batch.processing_status != "ended":
        return error("invalid_request_error", f"batch {batch.id} has not ended yet")
    content = "".join(line + "\n" for line in batch.results)
    return Response(content, media_type="application/x-jsonl")


async def list_batches(sim: AnthropicSimulator, request: Request) -> Response:
    """Newest first, ``limit`` (default 20, 1 to 1000) after the id ``after_id``."""
    if (refused := sim.refused(request)) is not None:
        return refused
    try:
        limit = int(request.query_params.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 1000:
        return error("invalid_request_error", "limit: a whole number from 1 to 1000")
    desk = sim.batches
    ids = list(reversed(desk.created))
    after = request.query_params.get("after_id")
    if after in ids:
        ids = ids[ids.index(after) + 1 :]
    page = ids[:limit]
    for batch_id in page:
        desk.advance(desk.batches[batch_id])
    base = str(request.base_url)
    return json_response({
        "data": [desk.batches[i].as_dict(base) for i in page],
        "has_more": len(ids) > limit,
        "first_id": page[0] if page else None,
        "last_id": page[-1] if page else None,
    })  # fmt: skip
