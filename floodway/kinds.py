"""Kinds: what a task of a given name runs, how it is limited and how it is retried."""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from floodway.config import KindConfig
from floodway.context import Context
from floodway.core.errors import ConfigError, UnknownKind
from floodway.core.hangup import Provider, unseen_call_s
from floodway.core.task import GLOBAL_SCOPE, JSON, Lane, Task, fingerprint, tenant_scope
from floodway.core.tiers import (
    LineResult,
    SoughtBatch,
    Tier,
    Turnarounds,
    UpstreamView,
    as_tier,
    choose_tier,
    turnarounds,
)
from floodway.core.upstream import JobView, PollSchedule

#: The defaults of a kind, whether declared in Python or in a config file: one home.
DEFAULTS = KindConfig()
#: how long a call of a kind without a timeout may run at the provider, at the longest
UNBOUNDED_CALL_S = 900.0

Handler = Callable[["Context", Any], Awaitable[JSON]]
CostFn = Callable[[Any], float]
#: Ask the provider whether work with this idempotency key exists: its result, or None.
Lookup = Callable[["Context"], Awaitable[JSON | None]]
#: Poll an upstream job: ("done", result) | ("failed", message) | ("running", None).
Poll = Callable[["Context", str], Awaitable[tuple[str, JSON]]]
#: Who shares a kind's results: each tenant its own (the default), or every tenant ("global":
#: a saving when tenants often ask for the same work, at the price of telling one tenant that
#: another asked for it, and giving it the other's result).
Share = Literal["tenant", "global"]


def check_resource(kind: str, resource: str | None, declared: Iterable[str]) -> None:
    """A kind's resource must be declared: one named nowhere would have no limits at all, and a
    typo would go unnoticed (no resource at all is a kind without limits, and says so)."""
    known = sorted(declared)
    if resource is None or resource in known:
        return
    near = difflib.get_close_matches(resource, known, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ConfigError(
        f"kind {kind!r} uses resource {resource!r}, which is declared nowhere{hint}: declare "
        f"it in the config file ([resources.{resource}] with concurrency, requests_per_minute, "
        f"...) or in Python (Floodway(..., resources={{{resource!r}: {{'concurrency': 10}}}})), "
        "or leave resource out for a kind without limits"
    )


class JobPoller(Protocol):
    """How a kind follows the upstream jobs its handler starts (see
    :class:`~floodway.core.outcome.Parked`): when to look, how to look, how to stop one, and
    how to read the provider's callback about one."""

    @property
    def schedule(self) -> PollSchedule: ...

    async def poll(self, ctx: Context, ref: str) -> tuple[str, JSON]:
        """One look: ("done", result) | ("failed", message) | ("running", None). Raise
        :class:`~floodway.core.errors.RetryableError` when the *poll* failed (the job may be
        fine), :class:`~floodway.core.errors.FatalError` when the job failed for good."""
        ...

    async def cancel(self, ctx: Context, ref: str) -> bool:
        """Ask the provider to stop the job; True if it agreed. Never raises."""
        ...

    def read_callback(self, body: JSON) -> tuple[str | None, JobView]:
        """The job id a callback body is about (None: it names none) and what it says."""
        ...

    @property
    def holds_slots(self) -> bool:
        """A parked task keeps its provider slot (a job runs upstream on its behalf); not so
        a line of a provider batch, which the batch queue's limits count instead."""
        ...


class BatchApi(Protocol):
    """A provider's batch API, for the provider batches of one kind (core/tiers.py)."""

    def line(self, custom_id: str, body: dict[str, object]) -> JSON:
        """One request of the batch (``custom_id``: its task's id)."""
        ...

    async def create(self, lines: list[JSON], tag: str) -> UpstreamView:
        """A provider batch of ``lines`` created (``tag``: floodway's id of it, which the
        provider keeps where its API has a place for one)."""
        ...

    async def find(self, sought: SoughtBatch) -> list[UpstreamView]:
        """The provider batches that may be the one created for ``sought`` (after a crash
        between its creation and its record), the likeliest first."""
        ...

    async def retrieve(self, ref: str) -> UpstreamView: ...

    async def cancel(self, ref: str) -> UpstreamView:
        """Stop the batch: the lines it answered stay answered (and billed)."""
        ...

    async def results(self, view: UpstreamView) -> list[LineResult]:
        """The lines an ended batch answered or failed."""
        ...


@dataclass(frozen=True)
class TierPlan:
    """The tiers a kind's tasks may go on (core/tiers.py), and how its batches are packed."""

    offered: tuple[Tier, ...] = ("sync",)
    times: Turnarounds = field(default_factory=lambda: turnarounds(DEFAULTS.timeout, {}))
    batch: BatchApi | None = None
    max_lines: int = DEFAULTS.batch_max_lines
    max_age_s: float = DEFAULTS.batch_max_age
    #: most lines in provider batches not ended yet (None: no limit)
    queue_limit: int | None = DEFAULTS.batch_queue_limit

    def choose(self, task: Task, now: float, *, without: tuple[Tier, ...] = ()) -> Tier:
        """The tier ``task``'s call goes on now (``without``: tiers it may no longer take)."""
        pinned = as_tier(task.tier) if task.tier in self.offered else None
        if pinned in without:
            pinned = None
        return choose_tier(
            [t for t in self.offered if t not in without],
            pinned=pinned,
            interactive=task.lane is Lane.INTERACTIVE,
            remaining_s=None if task.deadline_at is None else task.deadline_at - now,
            times=self.times,
        )

    def room(self, enqueued: int, queued: int) -> int:
        """How many of ``queued`` lines may be sent now, ``enqueued`` being in provider
        batches not ended yet (the provider's queue limit)."""
        if self.queue_limit is None:
            return queued
        return max(0, min(queued, self.queue_limit - enqueued))

    def batch_by(self, now: float) -> float:
        """A task due before this cannot wait for a provider batch (:func:`choose_tier`'s
        rule): the batch tier's turnaround and a sync call after it."""
        return now + self.times.room_for("batch")

    def leave_by(self, deadline_at: float) -> float:
        """When a line still waiting in a batch must leave it to be sent on the sync tier
        before ``deadline_at``: room for a sync call and one retry of it."""
        return deadline_at - 2 * self.times.expected("sync")


@dataclass(frozen=True)
class FunctionPoller:
    """The :class:`JobPoller` of a kind declared in Python with ``poll=``: the function polls,
    nothing cancels, and callbacks are read in the common shape
    (``{"id", "status", "result" | "error"}``)."""

    function: Poll
    schedule: PollSchedule

    async def poll(self, ctx: Context, ref: str) -> tuple[str, JSON]:
        return await self.function(ctx, ref)

    async def cancel(self, ctx: Context, ref: str) -> bool:
        return False

    def read_callback(self, body: JSON) -> tuple[str | None, JobView]:
        return read_callback(body)

    @property
    def holds_slots(self) -> bool:
        return True


def read_callback(body: JSON) -> tuple[str | None, JobView]:
    """A callback in the common shape (``{"id", "status", "result" | "error"}``): the job id
    it names and what it says. Kinds without an adapter of their own read callbacks so."""
    if not isinstance(body, dict):
        return None, JobView("running")
    ref = body.get("id")
    status = str(body.get("status", ""))
    if status in DEFAULTS.done_values:
        view = JobView("done", body.get("result", body))
    elif status in DEFAULTS.failed_values:
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        view = JobView("failed", message=str(message or f"the job ended {status}"))
    else:
        view = JobView("running")
    return (None if ref in (None, "") else str(ref)), view


@dataclass(frozen=True)
class KindSpec:
    name: str
    handler: Handler
    resource: str | None = None
    max_attempts: int = DEFAULTS.max_attempts
    deadline_s: float | None = DEFAULTS.deadline
    #: how long one call may take; twice that bounds how long a call floodway hung up on, or
    #: whose worker died, may still be running at the provider (its slot and work are held)
    timeout_s: float | None = DEFAULTS.timeout
    cost: CostFn | None = None
    version: str = DEFAULTS.version
    dedupe: bool = bool(DEFAULTS.dedupe)
    share: Share = DEFAULTS.share
    fallback: str | None = None
    output_schema: dict[str, Any] | None = None
    #: the provider honours the Idempotency-Key: resubmitting after a crash cannot charge twice
    idempotent: bool = False
    lookup: Lookup | None = None
    #: a timed-out call is sent again though the provider may bill both (see core/hangup.py)
    retry_timeouts: bool = DEFAULTS.retry_timeouts
    poll: JobPoller | None = None
    poll_max_attempts: int = DEFAULTS.poll_max_attempts
    #: closes what the handler holds (an adapter's pooled HTTP client) when floodway closes
    close: Callable[[], Awaitable[None]] | None = None
    #: which finished results a new identical request may take (None: every one); identical
    #: requests in flight at once share the work either way
    replays: Callable[[JSON], bool] | None = None
    #: the provider tiers its calls may go on (core/tiers.py)
    tiers: TierPlan = field(default_factory=TierPlan)

    def replays_result(self, value: JSON) -> bool:
        """Whether a success for ``value`` is kept for later identical requests."""
        return self.replays is None or self.replays(value)

    def work_print(self, value: JSON, tenant: str) -> str | None:
        """The fingerprint of this work for ``tenant`` (None: the kind does not dedupe)."""
        if not self.dedupe:
            return None
        scope = GLOBAL_SCOPE if self.share == "global" else tenant_scope(tenant)
        return fingerprint(self.name, self.version, value, scope)

    @property
    def longest_call_s(self) -> float:
        """How long floodway waits for one call: the kind's timeout. The provider may go on
        longer (core/hangup.py: unseen_call_s)."""
        return self.timeout_s if self.timeout_s is not None else UNBOUNDED_CALL_S

    @property
    def provider(self) -> Provider:
        """What the provider does with a call floodway has hung up on."""
        return Provider.of(self.idempotent, self.lookup is not None)

    def call_ends_by(self, task: Task) -> float:
        """When the task's current call will have ended at the latest: as bounded when the
        attempt started (from the kind's recent calls), else its start plus the timeout."""
        if task.call_ends_by is not None:
            return task.call_ends_by
        started = task.attempt_at if task.attempt_at is not None else task.updated_at
        return started + unseen_call_s(self.longest_call_s)

    def follows_job(self, task: Task) -> bool:
        """Whether ``task``'s attempt stands for an upstream job that takes a provider slot."""
        return task.upstream_ref is not None and self.poll is not None and self.poll.holds_slots

    def slot_held_until(self, task: Task, until: float, now: float) -> float:
        """Until when the provider slot of ``task``'s attempt, left open without a worker until
        ``until``, is held. A call has surely ended by ``until``. An upstream job may run far
        longer than the call that submitted it: ``until`` is only when the sweeper polls it
        again, and its slot is held until a poll finds it over (the sweeper frees it then)."""
        return max(until, now + UNBOUNDED_CALL_S) if self.follows_job(task) else until

    def estimate(self, value: JSON) -> float:
        if self.cost is None:
            return 0.0
        cost = float(self.cost(value))
        if cost < 0:
            raise ValueError(f"kind {self.name!r}: cost estimate is negative ({cost})")
        return cost


class KindRegistry:
    def __init__(self) -> None:
        self._kinds: dict[str, KindSpec] = {}

    def add(self, spec: KindSpec) -> None:
        if spec.name in self._kinds:
            raise ConfigError(f"kind {spec.name!r} is declared twice")
        if spec.max_attempts < 1:
            raise ConfigError(f"kind {spec.name!r}: max_attempts must be at least 1")
        self._kinds[spec.name] = spec

    def get(self, name: str) -> KindSpec:
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownKind(name, list(self._kinds)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def specs(self) -> list[KindSpec]:
        return list(self._kinds.values())

    def check_resources(self, declared: Iterable[str]) -> None:
        for spec in self._kinds.values():
            check_resource(spec.name, spec.resource, declared)

    def check_fallbacks(self) -> None:
        for spec in self._kinds.values():
            if spec.fallback is not None and spec.fallback not in self._kinds:
                raise ConfigError(f"kind {spec.name!r}: fallback kind {spec.fallback!r} unknown")
