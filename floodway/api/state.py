"""Everything one app holds, on ``app.state.api`` (no module globals: two apps in one process
never share a bucket, a registry or an outbox)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

from fastapi import Request

from floodway.api.history import History
from floodway.api.keys import KeyTable
from floodway.api.metrics import ApiMetrics
from floodway.api.schemas import StatsOut
from floodway.api.stats import Recent
from floodway.app import Floodway
from floodway.config import Settings
from floodway.core.job_durations import JobDurations
from floodway.limits.backend import LimiterBackend
from floodway.limits.base import ResourceSnapshot
from floodway.limits.submit_rate import SubmitRateLimiter
from floodway.runtime import Gate
from floodway.wire.cursors import KEY_BYTES as CURSOR_KEY_BYTES
from floodway.wire.cursors import KEY_NAME as CURSOR_KEY
from floodway.wire.cursors import Cursors


@dataclass
class ApiState:
    fw: Floodway
    #: set by the lifespan when ``[tenants] submit_rate`` is configured
    submit_rate: SubmitRateLimiter | None = None
    #: the limiter backend this process's API uses (the submit rate's, and the one health
    #: probes when ``redis`` is set); set by the lifespan
    limiter: LimiterBackend | None = None
    #: recent ``/v1/stats`` answers, the operator's (None) and each key's tenant's (set by
    #: the lifespan)
    history: History[dict[str | None, StatsOut]] | None = None
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    recent: Recent = field(default_factory=Recent)
    #: slow re-check of an event stream, for changes written by other processes
    sse_recheck_s: float = 3.0
    #: per kind, how long recent /openai/v1 calls took from submit to answer (the
    #: Retry-After of a call that would pass its deadline)
    call_durations: dict[str, JobDurations] = field(default_factory=dict)
    #: (when, the limits' snapshot) behind the x-ratelimit-* headers of /openai/v1 answers
    limits_view: tuple[float, dict[str, ResourceSnapshot]] | None = None

    _cursors: Cursors | None = None

    async def cursors(self) -> Cursors:
        """The page cursors' codec, under the deployment's key (read once)."""
        if self._cursors is None:
            self._cursors = Cursors(await self.fw.server_key(CURSOR_KEY, CURSOR_KEY_BYTES))
        return self._cursors

    @property
    def settings(self) -> Settings:
        return self.fw.settings

    @cached_property
    def keys(self) -> KeyTable:
        """The configured API keys, read once: an app's settings do not change under it."""
        return KeyTable(self.settings.api.keys, self.settings.api.admin_keys)

    @property
    def gate(self) -> Gate:
        """What a submit through this API passes besides the library's checks."""
        return Gate(self.settings.api.callback_hosts, self.submit_rate)


async def api_state(request: Request) -> ApiState:
    # async: FastAPI runs a plain ``def`` dependency in a thread, a hop on every request
    return cast(ApiState, request.app.state.api)
