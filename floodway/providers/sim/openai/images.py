"""``POST /v1/images/generations``: ``n`` image URLs (the ledger counts images as tokens)."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from floodway.providers.sim.model import Job
from floodway.providers.sim.openai.calls import BadRequest, OpenAISimulator, created, read_body
from floodway.providers.sim.openai.wire import json_response


def routes(sim: OpenAISimulator) -> list[Route]:
    return [Route("/v1/images/generations", partial(create, sim), methods=["POST"])]


async def create(sim: OpenAISimulator, request: Request) -> Response:
    try:
        body = await read_body(request)
        if not isinstance(body.get("prompt"), str) or not body["prompt"]:
            raise BadRequest("prompt", "prompt must be a non-empty string")
        count = body.get("n", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10:
            raise BadRequest("n", "n must be an integer from 1 to 10")
    except BadRequest as exc:
        return exc.response()

    async def answer(job: Job) -> Response:
        data = [{"url": f"https://sim.invalid/img/{job.id}-{i}.png"} for i in range(count)]
        whole = {"created": created(), "data": data}
        sim.bill(job, count, whole)
        return json_response(whole)

    return await sim.call(request.headers.get("idempotency-key"), body, count, answer)
