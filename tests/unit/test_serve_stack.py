"""``floodway serve`` and ``floodway api`` run uvicorn on its fast stack: uvloop and httptools
(both come with ``uvicorn[standard]``). uvicorn's ``auto`` falls back to asyncio and h11
without a word when they are missing, at a higher CPU cost per request."""

from __future__ import annotations

import sys

import pytest
from starlette.applications import Starlette
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from floodway.api.serve import uvicorn_config


@pytest.mark.skipif(sys.platform == "win32", reason="uvicorn[standard] has no uvloop on Windows")
def test_the_server_runs_on_uvloop_and_httptools() -> None:
    import uvloop

    config = uvicorn_config(Starlette())
    config.load()
    assert issubclass(config.http_protocol_class, HttpToolsProtocol)  # answering problems
    factory = config.get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
