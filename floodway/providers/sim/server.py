"""Running the simulator: inside the caller's event loop (tests, benchmarks, the demo) or as a
blocking process (``floodway simulate``)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from floodway.providers.sim.anthropic import create_anthropic_simulator_app
from floodway.providers.sim.app import create_simulator_app, simulator_state
from floodway.providers.sim.config import SimulatorConfig
from floodway.providers.sim.openai import create_openai_simulator_app
from floodway.providers.sim.state import SimulatorState
from floodway.serving import bind_socket, serve_app

# A safety net only: running_simulator releases hung requests before stopping the server.
GRACEFUL_SHUTDOWN_S = 3


@dataclass(frozen=True)
class RunningSimulator:
    url: str
    """Base URL, e.g. ``http://127.0.0.1:51234``; the provider endpoint is ``url + "/generate"``."""
    state: SimulatorState
    """The live state, for reading the ledger and counters without HTTP."""
    app: FastAPI


@asynccontextmanager
async def running_simulator(
    config: SimulatorConfig | None = None, port: int = 0, host: str = "127.0.0.1"
) -> AsyncIterator[RunningSimulator]:
    """``async with running_simulator(SimulatorConfig(latency_ms=20)) as sim:`` a provider at
    ``sim.url``, shut down cleanly on exit."""
    app = create_simulator_app(config or SimulatorConfig())
    state = simulator_state(app)
    async with serve_app(app, port, host) as url:
        try:
            yield RunningSimulator(url=url, state=state, app=app)
        finally:
            state.begin_shutdown()


def run_simulator_blocking(
    config: SimulatorConfig,
    host: str = "127.0.0.1",
    port: int = 9000,
    *,
    sock: socket.socket | None = None,
    openai: bool = False,
    anthropic: bool = False,
) -> None:
    """Serve the simulator until interrupted (the ``floodway simulate`` command), on ``sock``
    if given (bound already), else on ``host:port`` (a taken port raises OSError).
    ``openai``: the OpenAI-compatible simulator instead of the image API; ``anthropic``:
    Anthropic's Messages and Message Batches APIs."""
    sock = sock or bind_socket(host, port)
    app: ASGIApp
    if anthropic:
        app = create_anthropic_simulator_app(config)
    elif openai:
        app = create_openai_simulator_app(config)
    else:
        app = create_simulator_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
