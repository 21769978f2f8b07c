"""The headers an OpenAI SDK reads, on every answer under ``/openai/v1``.

``x-request-id`` names the task (floodway's id for the call; a fresh id for an answer that
has no task), ``x-upstream-request-id`` the provider's answer to the call that did its work
(the provider's own request id: what its support asks for); an error carries what
:func:`floodway.wire.openai.error_headers` adds (the wait of a 429 in ``retry-after-ms``,
``x-should-retry: false`` where a retry cannot help); a call's answer carries
``x-ratelimit-*`` from floodway's own view of the limits it runs inside.
"""

from __future__ import annotations

import math
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from floodway.api.state import ApiState
from floodway.limits.base import BucketSnapshot, ResourceSnapshot
from floodway.wire.openai import error_headers

TASK_HEADER = "x-floodway-task"
REQUEST_ID = "x-request-id"
UPSTREAM_REQUEST_ID = "x-upstream-request-id"
#: how long one API process reuses its view of the limits for these headers
LIMITS_FRESH_S = 0.25


class OpenAIHeaders:
    """Adds ``x-request-id`` and the error headers to every answer under ``prefix``, those
    of the guard and the framework included (a raw ASGI middleware: no task per request)."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if REQUEST_ID not in headers:
                    headers[REQUEST_ID] = headers.get(TASK_HEADER) or f"req_{uuid.uuid4().hex}"
                status = message["status"]
                if status >= 400:
                    for name, value in error_headers(status, dict(headers)).items():
                        if name not in headers:
                            headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


def task_headers(task_id: str, upstream_request_id: str | None) -> dict[str, str]:
    """The headers naming a call: its task, and the provider's id of its answer when it has
    one (a joined or replayed call: the answer of the call that did the work)."""
    headers = {TASK_HEADER: task_id}
    if upstream_request_id:
        headers[UPSTREAM_REQUEST_ID] = upstream_request_id
    return headers


async def rate_headers(state: ApiState, resource: str | None) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` of ``resource`` as floodway
    sees it now: the per-minute limit in force, what its bucket holds (what may start at
    once) and the time until the bucket is full again. A dimension without a limit has none.
    """
    if resource is None:
        return {}
    snapshot = (await _snapshots(state)).get(resource)
    if snapshot is None:
        return {}
    out: dict[str, str] = {}
    for dimension, bucket in (("requests", snapshot.requests), ("tokens", snapshot.tokens)):
        limit = snapshot.limits.get(dimension)
        if limit is None or bucket is None:
            continue
        out.update(_dimension(dimension, limit.value, bucket))
    return out


def _dimension(name: str, per_minute: float, bucket: BucketSnapshot) -> dict[str, str]:
    remaining = max(0.0, min(per_minute, bucket.level))
    refill = bucket.refill_per_s
    reset_s = (bucket.capacity - bucket.level) / refill if refill > 0 else 0.0
    return {
        f"x-ratelimit-limit-{name}": str(math.floor(per_minute)),
        f"x-ratelimit-remaining-{name}": str(math.floor(remaining)),
        f"x-ratelimit-reset-{name}": duration(max(0.0, reset_s)),
    }


def duration(seconds: float) -> str:
    """A wait as OpenAI writes it in ``x-ratelimit-reset-*``: ``"20ms"``, ``"1.5s"``,
    ``"6m0s"``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


async def _snapshots(state: ApiState) -> dict[str, ResourceSnapshot]:
    now = state.fw.clock.now()
    cached = state.limits_view
    if cached is None or now - cached[0] > LIMITS_FRESH_S:
        cached = (now, await state.fw.runtime.admission.snapshot())
        state.limits_view = cached
    return cached[1]
