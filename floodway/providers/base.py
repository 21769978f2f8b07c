"""The adapter protocol: how floodway talks to a provider, and how an async upstream job waits.

An adapter submits work and, for providers that run it as an async job, polls the job, fetches
its result, cancels it and finds it again by idempotency key. It maps every answer into the retry
policy's classes (it raises :class:`~floodway.core.errors.RetryableError`,
:class:`~floodway.core.errors.FatalError` or :class:`~floodway.core.errors.InvalidOutput`),
reports the provider's usage with ``ctx.report_usage`` and copies rate-limit headers into
``ctx.response_headers``.

Waiting on an async job is a durable timer, not a sleeping handler: once the job id is recorded
(``ctx.set_upstream_ref``) the handler returns :class:`~floodway.core.outcome.Parked`; the worker
parks the task (still ``running``, no lease, no worker slot) and :mod:`floodway.worker.upstream`
polls it when it is due, following the kind's :class:`~floodway.core.upstream.PollSchedule`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import httpx

from floodway.context import Context
from floodway.core.outcome import Parked
from floodway.core.task import JSON
from floodway.core.upstream import JobView, PollSchedule


@dataclass(frozen=True)
class Finished:
    """The provider answered with the result itself (a sync call, or a finished job)."""

    result: JSON


@dataclass(frozen=True)
class Accepted:
    """The provider started an async job: ``ref`` is its id."""

    ref: str


Submission = Finished | Accepted


class Adapter(Protocol):
    """One provider API, configured for one kind."""

    name: str

    async def submit(self, ctx: Context, value: JSON) -> Submission:
        """Send the work (with ``Idempotency-Key: ctx.work_key``); map errors to the
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

    def job_id(self, body: JSON) -> str | None:
        """The job id a job description names (None: none)."""
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

    async def __call__(self, ctx: Context, value: JSON) -> JSON | Parked:
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
        return Parked(answer.ref, ctx.now() + self.schedule.first_delay())

    async def _resume(self, ctx: Context, ref: str) -> JSON | Parked | _Resubmit:
        assert self.jobs is not None
        state, value = await self.jobs.poll(ctx, ref)
        if state == "done":
            return value
        if state == "running":
            age = ctx.now() - (ctx.task.started_at or ctx.now())
            delay = self.schedule.next_delay(age, ctx.task.poll_attempts + 1)
            return Parked(ref, ctx.now() + delay)
        return _RESUBMIT

    async def aclose(self) -> None:
        await self.adapter.aclose()


@dataclass(frozen=True)
class UpstreamPoll:
    """The :class:`~floodway.kinds.JobPoller` of an adapter kind."""

    jobs: AsyncJobs
    schedule: PollSchedule

    async def poll(self, ctx: Context, ref: str) -> tuple[str, JSON]:
        return await self.jobs.poll(ctx, ref)

    async def cancel(self, ctx: Context, ref: str) -> bool:
        return await self.jobs.cancel(ctx, ref)

    def read_callback(self, body: JSON) -> tuple[str | None, JobView]:
        return self.jobs.job_id(body), self.jobs.interpret(body)

    @property
    def holds_slots(self) -> bool:
        return True


async def close_quietly(closer: Callable[[], Awaitable[None]]) -> None:
    """Close one client; a failure to close must not stop the others from closing."""
    with contextlib.suppress(httpx.HTTPError, RuntimeError, OSError):
        await closer()
