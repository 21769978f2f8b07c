"""The Anthropic simulator's app: its routes, the simulator's control routes (``GET
/ledger``: ``sync`` for the Messages calls, ``batch`` for the Message Batches), and the
``anthropic-ratelimit-*`` headers of its limits (``rpm``, ``tpm``) and the ``request-id``
Anthropic names each answer with."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from floodway.providers.sim.anthropic.calls import AnthropicSimulator
from floodway.providers.sim.anthropic.routes import routes
from floodway.providers.sim.anthropic.wire import rate_limit_headers
from floodway.providers.sim.app import RateLimitHeaders, RequestIds
from floodway.providers.sim.config import SimulatorConfig
from floodway.providers.sim.openai.wire import json_response


def create_anthropic_simulator_app(
    config: SimulatorConfig | None = None, clock: Callable[[], float] = time.time
) -> Starlette:
    """A fresh Anthropic simulator; its state is ``app.state.simulator``. ``clock`` is what
    its batches read time from (a test's fake clock). ``app.state.request_ids``: the
    ``request-id`` of its latest answers, the last one sent last."""
    sim = AnthropicSimulator(config or SimulatorConfig(), clock)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await sim.aclose()

    async def ledger(_: Request) -> Response:
        return json_response({"sync": sim.sync.as_dict(), "batch": sim.batches.ledger()})

    async def stats(_: Request) -> Response:
        return json_response(sim.core.stats.as_dict())

    async def reset(_: Request) -> Response:
        sim.reset()
        return json_response({"reset": True})

    control = [
        Route("/ledger", ledger),
        Route("/stats", stats),
        Route("/reset", reset, methods=["POST"]),
    ]
    app = Starlette(routes=[*routes(sim), *control], lifespan=lifespan)
    app.state.simulator = sim
    app.state.request_ids = RequestIds.sent_log()
    app.add_middleware(RequestIds, header="request-id", sent=app.state.request_ids)
    if sim.config.rate_headers:
        app.add_middleware(RateLimitHeaders, window=sim.core.window, written=rate_limit_headers)
    return app
