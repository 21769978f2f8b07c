"""Running the API under uvicorn: blocking (the CLI's ``serve`` and ``api``) or as a task of
the caller's event loop (tests, embedding)."""

from __future__ import annotations

import logging
import socket
from contextlib import AbstractAsyncContextManager

import uvicorn
from starlette.types import ASGIApp

from floodway.api.app import create_app
from floodway.api.auth import check_bind
from floodway.api.parser import ProblemHttpProtocol
from floodway.app import Floodway
from floodway.serving import GRACEFUL_SHUTDOWN_S, bind_socket, serve_app


def uvicorn_config(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "info"
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # A line per request costs more than a submit itself; FLOODWAY_LOG_LEVEL=info or
        # debug turns the access log on.
        access_log=logging.getLogger("floodway").isEnabledFor(logging.INFO),
        lifespan="on",  # the app's lifespan opens the ledger: a failure must stop start-up
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        proxy_headers=False,
        server_header=False,
        http=ProblemHttpProtocol,
    )


def run(
    fw: Floodway,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    run_workers: bool = True,
    concurrency: int | None = None,
    log_level: str = "info",
    sock: socket.socket | None = None,
) -> None:
    """Serve until interrupted: ``floodway serve`` (run_workers=True) and ``floodway api``
    (run_workers=False), on ``sock`` if given (bound to ``host:port`` already), else on a
    socket bound here. Raises ConfigError for an open API on a non-loopback host, and
    OSError when the port is taken (before anything is opened)."""
    check_bind(host, fw.settings)
    listening = sock or bind_socket(host, port)
    app = create_app(fw, run_workers=run_workers, concurrency=concurrency)
    config = uvicorn_config(app, host, port, log_level=log_level)
    try:
        uvicorn.Server(config).run(sockets=[listening])
    finally:
        listening.close()


def serving(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0
) -> AbstractAsyncContextManager[str]:
    """Serve ``app`` in the running loop; yields its base URL (port 0: any free port)."""
    return serve_app(app, port, host, http=ProblemHttpProtocol)
