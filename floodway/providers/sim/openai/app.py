"""The OpenAI-compatible simulator's app: each endpoint family's routes, the simulator's
control routes, and the headers OpenAI sends (``x-request-id``, ``x-ratelimit-*``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from floodway.providers.sim.app import RateLimitHeaders, RequestIds
from floodway.providers.sim.config import SimulatorConfig
from floodway.providers.sim.openai import batches, chat, embeddings, images, models, responses
from floodway.providers.sim.openai.calls import OpenAISimulator
from floodway.providers.sim.openai.wire import json_response

#: the endpoint families, each a module with ``routes(sim)``
FAMILIES = (chat, embeddings, images, responses, models, batches)


def create_openai_simulator_app(
    config: SimulatorConfig | None = None, clock: Callable[[], float] = time.time
) -> Starlette:
    """A fresh OpenAI-compatible simulator; its state is ``app.state.simulator``. ``clock``
    is what its batches read time from (a test's fake clock). ``app.state.request_ids``: the
    ``x-request-id`` of its latest answers, the last one sent last."""
    sim = OpenAISimulator(config or SimulatorConfig(), clock)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await sim.aclose()

    routes = [route for family in FAMILIES for route in family.routes(sim)]
    app = Starlette(routes=[*routes, *_control(sim)], lifespan=lifespan)
    app.state.simulator = sim
    app.state.request_ids = RequestIds.sent_log()
    app.add_middleware(RequestIds, header="x-request-id", sent=app.state.request_ids)
    if sim.config.rate_headers:
        app.add_middleware(RateLimitHeaders, window=sim.core.window)
    return app


def _control(sim: OpenAISimulator) -> list[Route]:
    async def ledger(_: Request) -> Response:
        return json_response({**sim.core.ledger.as_dict(), "batch": sim.batches.ledger()})

    async def stats(_: Request) -> Response:
        return json_response(sim.core.stats.as_dict())

    async def reset(_: Request) -> Response:
        sim.core.reset()
        sim.batches.reset()
        return json_response({"reset": True})

    return [
        Route("/ledger", ledger),
        Route("/stats", stats),
        Route("/reset", reset, methods=["POST"]),
    ]
