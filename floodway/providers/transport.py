"""The OpenAI adapter's HTTP transport: one pooled aiohttp session per kind.

The OpenAI-compatible front sends one provider call per request it serves, so the client's
own cost is the front's floor. Measured here (2 cores, 64 requests at once against
``floodway simulate --openai`` answering at once): httpx 150-220 requests/s at 1.7-4.3 ms of
CPU each, aiohttp 6,300/s at 0.12 ms. Answers are handed on as :class:`httpx.Response`
objects, so the mapping of statuses and headers to the retry policy's classes
(:mod:`floodway.providers.responses`) is written once for every adapter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import aiohttp
import httpx

from floodway.core.errors import RetryableError
from floodway.providers.responses import keep_headers

if TYPE_CHECKING:
    from floodway.context import Context


class AioSession:
    """A pooled :class:`aiohttp.ClientSession`, made on first use (a session belongs to the
    running event loop) and closed by :meth:`aclose`."""

    def __init__(self, timeout_s: float, *, max_connections: int = 256) -> None:
        # The whole request may take timeout_s (the executor bounds the handler the same way);
        # connecting is capped lower so a dead host fails fast and is retried.
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(timeout_s, 10.0))
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=True
            )
        return self._session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def post(
        self, ctx: Context, url: str, body: bytes, headers: Mapping[str, str], what: str
    ) -> httpx.Response:
        """POST ``body``; the whole answer. Transport failures are retryable errors; the
        rate-limit headers go to ``ctx``."""
        async with self.open(url, body, headers, what) as answer:
            response = as_httpx(answer, await answer.read())
        keep_headers(ctx, response)
        return response

    @asynccontextmanager
    async def open(
        self, url: str, body: bytes, headers: Mapping[str, str], what: str
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST ``body`` and hold the answer open (a stream is read from it as it comes);
        transport failures while it is open are retryable errors too."""
        try:
            async with self.session.post(url, data=body, headers=headers) as answer:
                yield answer
        except TimeoutError as exc:
            raise RetryableError(f"{what}: timed out", type="timeout") from exc
        except aiohttp.ClientError as exc:
            raise RetryableError(f"{what}: {type(exc).__name__}: {exc}", type="connection") from exc


def as_httpx(answer: aiohttp.ClientResponse, content: bytes) -> httpx.Response:
    """The answer as httpx's response (status, headers, body), which the error mapping reads."""
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in answer.raw_headers]
    return httpx.Response(answer.status, headers=headers, content=content)
