"""Everything the simulator remembers: jobs, idempotency keys, the charge ledger, the rate
window and the counters. One instance per app; the HTTP layer only translates.

Decisions are plain synchronous methods, so each runs without interruption on the event loop:
two requests can never both take the last concurrency slot, or both claim one idempotency key.

Async mode: a 429 (limits or spontaneous), a refusal (400) or a hang (504) is answered to the
submit request itself; anything else is accepted (202, billed at once) and ends later as
``succeeded`` (possibly malformed) or ``failed`` (5xx). A failed job is refunded and frees its key,
as providers do not bill failed predictions.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from floodway.clock import event_set_within
from floodway.providers.sim.config import SimulatorConfig
from floodway.providers.sim.model import Fate, Job, Submission
from floodway.providers.sim.webhooks import deliver
from floodway.providers.sim.window import RateWindow

WEBHOOK_TIMEOUT_S = 5.0


@dataclass(slots=True)
class Stats:
    requests: int = 0
    in_flight: int = 0
    peak_concurrency: int = 0
    rate_limited: int = 0
    errors_5xx: int = 0
    timeouts: int = 0
    refusals: int = 0
    malformed: int = 0
    succeeded: int = 0
    invalid: int = 0
    replays: int = 0
    conflicts: int = 0
    jobs_submitted: int = 0
    cancelled: int = 0
    polls: int = 0
    lookups: int = 0
    webhooks_sent: int = 0
    webhooks_failed: int = 0
    webhooks_dropped: int = 0
    #: sync requests served with a latency, and the sum of those latencies: the provider's
    #: busy time, a 5xx as much as a success (a 429 is answered at once and costs nothing)
    served: int = 0
    busy_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class Ledger:
    """What the provider billed, per idempotency key ("anon-<n>" for requests without one):
    how many times, and the tokens billed (the usage each billed job reported)."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.total = 0
        self.total_tokens = 0
        self._anonymous = 0

    def charge(self, key: str | None, tokens: int = 0) -> str:
        if key is None:
            self._anonymous += 1
            key = f"anon-{self._anonymous}"
        self.charges[key] = self.charges.get(key, 0) + 1
        self.tokens[key] = self.tokens.get(key, 0) + tokens
        self.total += 1
        self.total_tokens += tokens
        return key

    def refund(self, key: str, tokens: int = 0) -> None:
        remaining = self.charges.get(key, 0) - 1
        if remaining < 0:
            return
        if remaining:
            self.charges[key] = remaining
            self.tokens[key] -= tokens
        else:
            del self.charges[key]
            del self.tokens[key]
        self.total -= 1
        self.total_tokens -= tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "charges": dict(self.charges),
            "total": self.total,
            "tokens": self.total_tokens,
            "double_charged": sorted(k for k, n in self.charges.items() if n > 1),
        }


@dataclass(frozen=True, slots=True)
class Replay:
    job: Job


@dataclass(frozen=True, slots=True)
class Rejection:
    status: int
    type: str
    message: str
    retry_after: int | None = None
    retry_after_ms: int | None = None  # the exact wait, when the limit knows it


@dataclass(frozen=True, slots=True)
class Admission:
    job: Job
    outcome: Fate


Decision = Replay | Rejection | Admission


class SimulatorState:
    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.window = RateWindow(config.rpm, config.tpm, rpm_burst=config.rpm_burst)
        self.ledger = Ledger()
        self.stats = Stats()
        self.jobs: dict[str, Job] = {}
        self._by_key: dict[str, Job] = {}
        # Requests still running when /reset came must not touch the fresh ledger and counters.
        self._generation = 0
        self._id_prefix = f"{self.rng.getrandbits(32):08x}"
        self._next_id = 0
        self._misbehaviours = [
            (Fate.RATE_LIMITED, config.rate_limit_rate),
            (Fate.REFUSAL, config.refusal_rate),
            (Fate.SERVER_ERROR, config.error_rate),
            (Fate.TIMEOUT, config.timeout_rate),
            (Fate.MALFORMED, config.malformed_rate),
        ]
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None
        self._closing = asyncio.Event()

    # -- arrival ------------------------------------------------------------------------------

    def submit(self, sub: Submission, now: float) -> Decision:
        """Decide what happens to a /generate request the moment it arrives."""
        replay = self._idempotency(sub.key)
        if replay is not None:
            return replay
        refused = self._limits(sub.tokens, now)
        if refused is not None:
            return refused
        outcome = sub.forced or self._draw()
        if outcome is Fate.RATE_LIMITED:
            self.stats.rate_limited += 1
            return Rejection(429, "rate_limited", "the provider is overloaded, retry later", 1)
        return Admission(self._start(sub, now), outcome)

    def _idempotency(self, key: str | None) -> Replay | Rejection | None:
        if key is None or not self.config.honor_idempotency_key:
            return None
        job = self._by_key.get(key)
        if job is None:
            return None
        if job.charged_as is not None:
            self.stats.replays += 1
            return Replay(job)
        if job.status == "running":
            self.stats.conflicts += 1
            return Rejection(409, "conflict", "request with this key in progress")
        return None  # the earlier attempt failed unbilled: this one is new work

    def _limits(self, tokens: int, now: float) -> Rejection | None:
        if self.config.tpm and tokens > self.config.tpm:
            # It would never fit: a 429 would have the caller retry forever.
            self.stats.invalid += 1
            return Rejection(
                400,
                "request_too_large",
                f"{tokens} tokens exceed the {self.config.tpm} tokens per minute limit",
            )
        cap = self.config.max_concurrency
        if cap and self.stats.in_flight >= cap:
            self.stats.rate_limited += 1
            return Rejection(429, "rate_limited", "concurrency limit", 1)
        wait = self.window.wait_for(tokens, now)
        if wait is not None:
            self.stats.rate_limited += 1
            seconds, which = wait
            if self.window.exact:
                millis = math.ceil(seconds * 1000)
                return Rejection(429, "rate_limited", which, math.ceil(millis / 1000), millis)
            return Rejection(429, "rate_limited", which, max(1, math.ceil(seconds)))
        return None

    def _draw(self) -> Fate:
        u = self.rng.random()
        for outcome, rate in self._misbehaviours:
            if u < rate:
                return outcome
            u -= rate
        return Fate.OK

    def _start(self, sub: Submission, now: float) -> Job:
        self._next_id += 1
        job = Job(
            id=f"job-{self._id_prefix}-{self._next_id}",
            key=sub.key,
            input=sub.input,
            tokens=sub.tokens,
            callback_url=sub.callback_url,
            generation=self._generation,
        )
        self.window.record(sub.tokens, now)
        self.stats.in_flight += 1
        self.stats.peak_concurrency = max(self.stats.peak_concurrency, self.stats.in_flight)
        self.jobs[job.id] = job
        if sub.key is not None and self.config.honor_idempotency_key:
            self._by_key[sub.key] = job
        return job

    # -- work ---------------------------------------------------------------------------------

    def latency_s(self) -> float:
        """The latency of a sync request about to be served, counted as busy time."""
        seconds = self._jittered(self.config.latency_ms)
        self.stats.served += 1
        self.stats.busy_s += seconds
        return seconds

    async def hang(self) -> None:
        """Stall like a stuck upstream; cut short when the simulator shuts down."""
        await event_set_within(self._closing, self.config.hang_s)

    async def serve(self, job: Job, outcome: Fate) -> None:
        """Take a sync request's time: its latency, or a stall for a timeout. A request cut
        short (the server shutting down) frees its slot."""
        try:
            if outcome is Fate.TIMEOUT:
                await self.hang()
            else:
                await asyncio.sleep(self.latency_s())
        except asyncio.CancelledError:
            self.abandon(job)
            raise

    def finish(self, job: Job, outcome: Fate) -> None:
        """End a running job: free its slot, write its result, bill or refund it."""
        if job.status != "running":
            return
        self.stats.in_flight -= 1
        job.settle(outcome)
        if job.generation != self._generation:
            return
        self._count(outcome)
        if job.status == "succeeded" and job.charged_as is None:
            job.charged_as = self.ledger.charge(job.key, job.tokens)
        elif job.status == "failed" and job.charged_as is not None:
            self.ledger.refund(job.charged_as, job.tokens)
            job.charged_as = None

    def abandon(self, job: Job) -> None:
        """The request handling ``job`` was cancelled (server shutting down): free the slot."""
        self.finish(job, Fate.SERVER_ERROR)

    def launch(self, job: Job, outcome: Fate) -> None:
        """Accept an async job: billed now (the provider has started), ends after its duration
        with the outcome drawn on arrival."""
        self.stats.jobs_submitted += 1
        job.charged_as = self.ledger.charge(job.key, job.tokens)
        job.task = self._spawn(self._run_job(job, outcome))

    async def _run_job(self, job: Job, outcome: Fate) -> None:
        await asyncio.sleep(self._jittered(self.config.job_duration_ms))
        self.finish(job, outcome)
        self._call_back(job)

    def _count(self, outcome: Fate) -> None:
        stats = self.stats
        if outcome is Fate.OK:
            stats.succeeded += 1
        elif outcome is Fate.MALFORMED:
            stats.malformed += 1
        elif outcome is Fate.REFUSAL:
            stats.refusals += 1
        else:
            stats.errors_5xx += 1
            if outcome is Fate.TIMEOUT:
                stats.timeouts += 1

    def _jittered(self, mean_ms: float) -> float:
        spread = self.config.latency_jitter
        return mean_ms * (1.0 + self.rng.uniform(-spread, spread)) / 1000.0

    # -- queries and control ------------------------------------------------------------------

    def poll(self, job_id: str) -> Job | None:
        self.stats.polls += 1
        return self.jobs.get(job_id)

    def lookup(self, key: str) -> Job | None:
        self.stats.lookups += 1
        return self._by_key.get(key)

    def cancel(self, job_id: str) -> Job | Rejection:
        job = self.jobs.get(job_id)
        if job is None:
            return Rejection(404, "not_found", f"no job {job_id}")
        if job.status != "running":
            return Rejection(409, "conflict", f"job is already {job.status}")
        if job.task is None:
            return Rejection(409, "conflict", "a synchronous request cannot be cancelled")
        self._cancel(job)
        self.stats.cancelled += 1
        return job

    def _cancel(self, job: Job) -> None:
        # Still billed: the provider had started working on it.
        assert job.task is not None
        job.task.cancel()
        job.status = "cancelled"
        self.stats.in_flight -= 1

    def reset(self) -> None:
        """Forget all jobs, keys, charges and counters, as a fresh provider would."""
        for job in self.jobs.values():
            if job.status == "running" and job.task is not None:
                self._cancel(job)
        self._generation += 1
        self.jobs.clear()
        self._by_key.clear()
        self.window.clear()
        self.ledger = Ledger()
        in_flight = self.stats.in_flight  # sync requests still being served
        self.stats = Stats(in_flight=in_flight, peak_concurrency=in_flight)

    # -- webhooks and lifecycle ---------------------------------------------------------------

    def _call_back(self, job: Job) -> None:
        if not (self.config.webhook and job.callback_url):
            return
        if self.rng.random() < self.config.webhook_drop_rate:
            self.stats.webhooks_dropped += 1
            return
        self._spawn(self._send(job.callback_url, job.id, job.view()))

    async def _send(self, url: str, msg_id: str, payload: dict[str, Any]) -> None:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S)
        delivered = await deliver(self._http, url, self.config.webhook_secret, msg_id, payload)
        if delivered:
            self.stats.webhooks_sent += 1
        else:
            self.stats.webhooks_failed += 1

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def begin_shutdown(self) -> None:
        """Release hung requests so the HTTP server can drain."""
        self._closing.set()

    async def aclose(self) -> None:
        self._closing.set()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
            self._http = None
