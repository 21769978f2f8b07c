"""The outermost layer of the API: bounded bodies, bounded JSON depth, no bare 500s.

It reads the whole request body before any route runs (bodies are small: ``[api]
max_body_bytes``, 1 MiB by default), counting bytes as they arrive, so a client that lies in
``Content-Length`` or sends chunks without one is stopped at the limit all the same; and within
``[api] body_timeout``, so a client that sends headers and then nothing (slowloris) is answered
408 and its connection closed instead of being held open. The body is then replayed to the app.
JSON nested deeper than ``max_json_depth`` is refused before any parser recurses into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from floodway.api.problems import PROBLEM_JSON, problem_bytes

log = logging.getLogger("floodway.api")

# A JSON string (escapes included); removed before counting brackets, which may appear inside.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_INNERMOST = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
#: how much of an oversized body is read (and dropped) so the client can see the 413
DRAIN_BYTES = 1 << 20
DRAIN_SECONDS = 2.0


def json_too_deep(body: bytes, max_depth: int) -> bool:
    """True if ``body`` nests arrays/objects deeper than ``max_depth``.

    Each pass of the regex removes every innermost ``[]``/``{}`` pair, so the number of passes
    until nothing is left is the depth: at most ``max_depth + 1`` passes, each in C. Malformed
    bracket soup stops reducing and is left to the JSON parser to reject.
    """
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):
        if not brackets:
            return False
        reduced = _INNERMOST.sub(b"", brackets)
        if reduced == brackets:
            return False
        brackets = reduced
    return bool(brackets) and _INNERMOST.search(brackets) is not None


class _TooLarge(Exception):
    pass


class GuardMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_json_depth: int,
        body_timeout_s: float,
        on_response: Callable[[int], None] | None = None,
        larger: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        """``larger``: request paths (POST uploads) whose bodies may exceed max_body_bytes, with
        the name of the setting that bounds them instead and its value."""
        self.app = app
        self.larger = dict(larger or {})
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.max_json_depth = max_json_depth
        self.on_response = on_response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if self.on_response is not None:
                    self.on_response(int(message["status"]))
            await send(message)

        path = str(scope.get("path", ""))
        limit_name, max_bytes = self.larger.get(path, ("max_body_bytes", self.max_body_bytes))
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body = await self._read_body(scope, receive, max_bytes)
        except TimeoutError:
            await _answer(
                tracked_send,
                408,
                "body-timeout",
                f"the request body did not arrive within {self.body_timeout_s:g} s",
                instance=path,
                limit="body_timeout",
                timeout_s=self.body_timeout_s,
            )
            return
        except _TooLarge:
            await _answer(
                tracked_send,
                413,
                "body-too-large",
                f"the request body exceeds {max_bytes} bytes ({limit_name})",
                instance=path,
                limit=limit_name,
                max_bytes=max_bytes,
            )
            return
        if body is None:  # the client went away mid-body: nobody to answer
            return
        if _is_json(scope) and json_too_deep(body, self.max_json_depth):
            await _answer(
                tracked_send,
                400,
                "json-too-deep",
                f"the JSON body nests deeper than {self.max_json_depth} levels",
                instance=path,
                limit="max_json_depth",
                max_depth=self.max_json_depth,
            )
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect (event streams)

        try:
            await self.app(scope, replay, tracked_send)
        except Exception:
            # A bug, never the caller's fault: log it whole, answer a problem, keep serving.
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await _answer(tracked_send, 500, "internal-error", "internal error", instance=path)

    async def _read_body(self, scope: Scope, receive: Receive, max_bytes: int) -> bytes | None:
        declared = _header(scope, b"content-length")
        digits = declared is not None and declared.isascii() and declared.isdigit()
        over = int(declared) - max_bytes if declared and digits else 0
        if over > DRAIN_BYTES:
            raise _TooLarge  # refuse before reading a byte of it; a smaller overrun is drained
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                await _drain(receive, message)
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _drain(receive: Receive, last: Message) -> None:
    """Read and drop what the client is still sending, within bounds, before answering 413.

    Closing a socket with unread data in it makes the kernel reset the connection, and the
    client then often loses the 413 itself; a modest overrun is cheaper to swallow."""
    dropped = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DRAIN_SECONDS):
            while last.get("more_body", False) and dropped <= DRAIN_BYTES:
                last = await receive()
                if last["type"] == "http.disconnect":
                    return
                dropped += len(last.get("body", b""))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1").strip()
    return None


def _is_json(scope: Scope) -> bool:
    # A body without Content-Type is checked too: it may still reach a JSON parser (the 415 of
    # a JSON route says which header to add, but the webhook receiver parses any body).
    content_type = _header(scope, b"content-type")
    return content_type is None or "json" in content_type.lower()


async def _answer(
    send: Send, status: int, slug: str, detail: str, instance: str, **extra: object
) -> None:
    body = problem_bytes(status, slug, detail, instance, **extra)
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    if status in (408, 413):
        headers.append((b"connection", b"close"))  # we did not read the rest of it
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
