"""The adapter protocol: how floodway talks to a provider, and how an async upstream job waits.

An adapter submits work and, for providers that run it as an async job, polls the job, fetches
its result, cancels it and finds it again by idempotency key. It maps every answer into the retry
policy's classes (it raises :class:`~floodway.core.errors.RetryableError`,
:class:`~floodway.core.errors.FatalError` or :class:`~floodway.core.errors.InvalidOutput`),
reports the provider's usage with ``ctx.report_usage`` and copies rate-limit headers into
``ctx.response_headers``.

Waiting on an async job is a durable timer, not a sleeping handler: once the job id is recorded
(``ctx.set_upstream_ref``) the handler raises :class:`ParkUpstream`; the worker parks the task
(still ``running``, no lease, no worker slot) and :mod:`floodway.worker.upstream` polls it when it
is due, following the kind's :class:`PollSchedule`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import httpx

from floodway.core.task import JSON
from floodway.providers.job_durations import JobDurations
from floodway.retry import Backoff

if TYPE_CHECKING:
    from floodway.context import Context

JobState = Literal["done", "failed", "running"]


class ParkUpstream(BaseException):
    """Raised by a handler whose upstream job is still running: "wake me for a poll at
    ``poll_at``". The worker parks the task instead of holding a slot while the provider works.

    A :class:`BaseException` on purpose: a handler's own ``except Exception`` must not swallow
    it, and the executor passes it through to the worker untouched (as it does cancellation).
    """

    def __init__(self, ref: str, poll_at: float) -> None:
        super().__init__(ref, poll_at)
        self.ref = ref
        self.poll_at = poll_at


@dataclass(frozen=True)
class Finished:
    """The provider answered with the result itself (a sync call, or a finished job)."""

    result: JSON


@dataclass(frozen=True)
class Accepted:
    """The provider started an async job: ``ref`` is its id."""

    ref: str


Submission = Finished | Accepted


@dataclass(frozen=True)
class JobView:
    """A provider's description of one job (a poll answer or a callback body)."""

    state: JobState
    result: JSON = None
    message: str = ""  # why it failed
    error_type: str | None = None  # the provider's error type/code, when it failed
    usage: float | None = None


@dataclass(frozen=True)
class PollSchedule:
    """When to poll an upstream job.

    The first poll comes ``first_s`` after the submit: the kind's ``poll_after`` (set it near the
    *shortest* typical job duration), or ``callback_grace`` when the provider calls back and
    polling is only the fallback for lost callbacks. With ``poll_after`` unset, a low quantile of
    the kind's recent job durations (``durations``) plays its part once one job has finished.
    After that, the gap before the next poll has
    a ceiling of ``ratio`` x the job's age (capped at ``max_gap_s``) and is drawn by the one
    backoff policy (:class:`floodway.retry.Backoff`, full jitter) over the top ``jitter`` share
    of that ceiling:

    - proportional to age, not to the number of polls: "still running at t" says the job is
      probably of the order of t long. A gap of at most ``ratio`` x t bounds the detection lag by
      ``ratio`` x the job's duration by construction, and the number of polls grows with
      log(duration / first_s), not with the duration.
    - jitter over the top quarter, not over the whole ceiling: it still spreads tasks submitted
      together, while full jitter over [0, ceiling] spends many short gaps that learn nothing.
      Modelled for jobs of uniform 2-4 s, first poll at 2 s (mean polls / p95 lag as a share of
      the duration): full jitter, ratio 0.15: 7.1 / 11.6 %; ratio 0.2: 5.8 / 15.4 %. Top half,
      ratio 0.15: 5.1 / 12 %. Top quarter, ratio 0.13: 5.1 / 11 %, which leaves room under both
      targets (6 polls, 15 %) for the time polling itself takes; bench/upstream.py measures it.
    """

    first_s: float = 1.0
    ratio: float = 0.13
    jitter: float = 0.25
    min_gap_s: float = 0.01
    max_gap_s: float = 60.0
    #: set when ``poll_after`` is not: no poll before a job's age reaches a low quantile of the
    #: kind's recent durations (``first_s`` applies until one finished)
    durations: JobDurations | None = field(default=None, compare=False)

    def first_delay(self) -> float:
        """Seconds from the submit to the first poll."""
        learned = None if self.durations is None else self.durations.leave_alone_s()
        return self.first_s if learned is None else learned

    def next_delay(self, age_s: float, polls: int, rng: random.Random | None = None) -> float:
        """Seconds until the next poll of a job ``age_s`` old that was polled ``polls`` times."""
        ceiling = min(self.max_gap_s, max(self.min_gap_s, self.ratio * max(0.0, age_s)))
        spread = ceiling * self.jitter
        delay = ceiling - spread + Backoff(base_s=spread, cap_s=spread).delay(max(1, polls), rng)
        learned = None if self.durations is None else self.durations.leave_alone_s()
        return delay if learned is None else max(delay, learned - age_s)

    def observe(self, started_at: float, finished_at: float) -> None:
        """A job of the kind submitted at ``started_at`` was seen finished at ``finished_at``."""
        if self.durations is not None:
            self.durations.record(started_at, finished_at)


class Adapter(Protocol):
    """One provider API, configured for one kind."""

    name: str

    async def submit(self, ctx: Context, value: JSON) -> Submission:
        """Send the work (with ``Idempotency-Key: ctx.idempotency_key``); map errors to the
        retry policy's classes; report usage and rate-limit headers."""
        ...

    def estimate(self, value: JSON) -> float:
        """The cost (tokens, characters, images...) a task will use, before it runs."""
        ...

    async def aclose(self) -> None:
        """Close the pooled HTTP client (it is created again on next use)."""
        ...


class AsyncJobs(Protocol):
    """What an adapter whose provider runs async jobs offers besides :class:`Adapter`."""

    async def poll(self, ctx: Context, ref: str) -> tuple[str, JSON]:
        """One look at the job: ("done", result) | ("failed", message) | ("running", None).
        Raise :class:`RetryableError` when the *poll request* failed (the job may be fine),
        :class:`FatalError` when the job failed in a way a resubmit cannot fix."""
        ...

    async def fetch_result(self, ctx: Context, ref: str) -> JSON:
        """The result of a finished job."""
        ...

    async def cancel(self, ctx: Context, ref: str) -> bool:
        """Ask the provider to stop the job; True if it agreed. Never raises."""
        ...

    def interpret(self, body: JSON) -> JobView:
        """Read a job description (poll answer or callback body)."""
        ...


class SharedClient:
    """One pooled :class:`httpx.AsyncClient` per kind, closed by :meth:`aclose` (after which the
    next use creates a new one). Created with the kind, not on its first call: building a
    client loads the CA bundle (60-230 ms measured here), a delay the first task of a run
    would otherwise wait out."""

    def __init__(self, timeout_s: float, *, max_connections: int = 100) -> None:
        # The whole request may take timeout_s (the executor bounds the handler the same way);
        # connecting is capped lower so a dead host fails fast and is retried.
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        # Few idle connections: httpcore's pool scans its idle ones (quadratically) on every
        # request, which costs more CPU than reopening one after a burst (measured: -25 % CPU
        # per poll with 10 instead of 25).
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=min(10, max_connections)
        )
        self._client: httpx.AsyncClient | None = self._new()

    def _new(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout, limits=self._limits)

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = self._new()
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class _Resubmit:
    """The resumed job is gone or failed: submit the work again."""


_RESUBMIT = _Resubmit()


class AdapterHandler:
    """The kind's handler for an adapter: submit, or resume the recorded upstream job.

    On a fresh attempt it submits; a finished answer is the result, an accepted job is recorded
    durably (``ctx.set_upstream_ref``) and parked until its first poll. When ``ctx.upstream_ref``
    is already set (crash recovery, or a retry after a poll), it looks at that job once instead of
    paying for the work again: done -> its result (validated by the executor like any result),
    running -> parked again, failed or unknown -> submitted anew.
    """

    def __init__(self, adapter: Adapter, jobs: AsyncJobs | None, schedule: PollSchedule) -> None:
        self.adapter = adapter
        self.jobs = jobs
        self.schedule = schedule

    async def __call__(self, ctx: Context, value: JSON) -> JSON:
        if ctx.upstream_ref is not None and self.jobs is not None:
            resumed = await self._resume(ctx, ctx.upstream_ref)
            if not isinstance(resumed, _Resubmit):
                return resumed
        answer = await self.adapter.submit(ctx, value)
        if isinstance(answer, Finished):
            return answer.result
        if self.jobs is None:
            raise RuntimeError(f"{self.adapter.name}: an async job, but the kind cannot poll")
        await ctx.set_upstream_ref(answer.ref)
        raise ParkUpstream(answer.ref, ctx.now() + self.schedule.first_delay())

    async def _resume(self, ctx: Context, ref: str) -> JSON | _Resubmit:
        assert self.jobs is not None
        state, value = await self.jobs.poll(ctx, ref)
        if state == "done":
            return value
        if state == "running":
            age = ctx.now() - (ctx.task.started_at or ctx.now())
            delay = self.schedule.next_delay(age, ctx.task.poll_attempts + 1)
            raise ParkUpstream(ref, ctx.now() + delay)
        return _RESUBMIT

    async def aclose(self) -> None:
        await self.adapter.aclose()


@dataclass(frozen=True)
class UpstreamPoll:
    """``KindSpec.poll`` for an adapter kind; also carries what the poller and the webhook
    receiver need: the schedule, upstream cancel and the job reader."""

    jobs: AsyncJobs
    schedule: PollSchedule

    async def __call__(self, ctx: Context, ref: str) -> tuple[str, JSON]:
        return await self.jobs.poll(ctx, ref)

    async def cancel(self, ctx: Context, ref: str) -> bool:
        return await self.jobs.cancel(ctx, ref)

    def interpret(self, body: JSON) -> JobView:
        return self.jobs.interpret(body)


#: what a kind's ``poll`` may offer beyond being called (looked up with getattr)
CancelFn = Callable[["Context", str], Awaitable[bool]]


async def close_quietly(closer: Callable[[], Awaitable[None]]) -> None:
    """Close one client; a failure to close must not stop the others from closing."""
    with contextlib.suppress(httpx.HTTPError, RuntimeError, OSError):
        await closer()
