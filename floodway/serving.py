"""Serving an ASGI app with uvicorn as a task of the running event loop (the API in tests and
embedding, the simulated provider, small receivers in tests)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.types import ASGIApp

STARTUP_TIMEOUT_S = 10.0
#: long enough for in-flight requests, short enough that an open event stream cannot hold a
#: shutdown hostage
GRACEFUL_SHUTDOWN_S = 5


@asynccontextmanager
async def serve_app(
    app: ASGIApp,
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    http: type[asyncio.Protocol] | str = "auto",
) -> AsyncIterator[str]:
    """Serve any ASGI app with uvicorn as a task of the running loop; yields its base URL.
    ``http``: uvicorn's HTTP protocol (its name or class)."""
    sock = bind_socket(host, port)
    config = uvicorn.Config(
        app,
        http=http,
        log_level="warning",
        log_config=None,  # leave the host process's logging alone
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await _until_started(server, task)
        bound_host, bound_port = server.servers[0].sockets[0].getsockname()[:2]
        yield (
            f"http://[{bound_host}]:{bound_port}"
            if ":" in bound_host
            else f"http://{bound_host}:{bound_port}"
        )
    finally:
        server.should_exit = True
        await task
        sock.close()


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host:port``; a taken port raises OSError (uvicorn, left
    to bind, would log and ``sys.exit``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only when it does,
    # and without it every keep-alive response waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def _until_started(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    # uvicorn offers no "started" event; poll its flag, and notice if serving ended instead.
    deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_S
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the server stopped during start-up")
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"the server did not start within {STARTUP_TIMEOUT_S:g} s")
        await asyncio.sleep(0.005)
