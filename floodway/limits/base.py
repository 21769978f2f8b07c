"""The seam between the dispatcher and the limiters.

The dispatcher lists ready tasks (:class:`floodway.store.base.Candidate`), asks
:meth:`Admission.admit` which of them may start now, claims exactly those, and settles each
permit when its task stops using the provider. A candidate not admitted stays ``queued`` and
holds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from floodway.core.task import Candidate


@dataclass(frozen=True)
class Permit:
    """What one admitted task holds: a concurrency slot and/or tokens, per dimension."""

    task_id: str
    resource: str | None
    tenant: str
    cost: float
    holds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Room:
    """Which kinds an admission pass could admit a task of now, by the slot counts."""

    kinds: tuple[str, ...]
    #: at most this many at once (their resources' free slots); None when a kind's resource
    #: has no in-flight cap (or the kind has no resource): nothing bounds the pass but the rest
    most: int | None


@dataclass(frozen=True)
class Settlement:
    """How the call went, so the limiter can refund, debit and adapt."""

    actual_cost: float | None = None
    throttled: bool = False  # the provider answered 429
    retry_after: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # x-ratelimit-* and friends
    keep_slot: bool = False  # an upstream job still runs: keep the concurrency slot
    #: the provider answered that the same work is in progress (a call a dead worker left
    #: running): its slot stays taken this long at most, for the task's next attempt to take
    #: over
    still_running_s: float | None = None
    #: the provider's error type and message, when it refused: "too many concurrent requests"
    #: tells a concurrency limit from a rate limit
    reason: str = ""


@dataclass(frozen=True)
class BucketSnapshot:
    capacity: float
    level: float
    refill_per_s: float  # the rate in force


@dataclass(frozen=True)
class LimitSnapshot:
    """One dimension's limit in force and where it comes from."""

    value: float  # slots, or per minute for the rates (as configured)
    source: str  # configured | header | learned
    configured: float | None  # per minute for the rates, at headroom
    published: float | None  # the provider's figure (its headers), per minute for the rates
    learned: float | None  # the fleet's estimate, per minute for the rates
    slow_start: bool = False  # learned concurrency that no 429 has bounded yet


@dataclass(frozen=True)
class ResourceSnapshot:
    """A resource's state for metrics. Counters are this process's own."""

    concurrency: int  # in-flight cap in force; 0 = none
    in_flight: int
    requests: BucketSnapshot | None
    tokens: BucketSnapshot | None
    rate_factor: float  # the requests rate in force over the configured one (1.0 if none)
    paused_for: float  # seconds until the resource admits again after a pause
    throttled_s: float  # seconds of pause this process imposed (Retry-After, exhausted headers)
    throttles: int  # 429s this process saw
    next_admission_in: float | None = None
    #: dimension -> its limit in force (absent: nothing limits that dimension)
    limits: dict[str, LimitSnapshot] = field(default_factory=dict)
    throttles_limit: int = 0  # 429s judged a limit (they paused the resource or cut a limit)
    throttles_noise: int = 0  # 429s judged noise (only the refused task waited)
    pauses: int = 0  # pauses this process imposed
    sending_per_min: float | None = None  # requests sent lately, fleet-wide (adaptive only)
    #: what held candidates back in this process's last admission pass (reason -> how many):
    #: concurrency, requests, tokens, pause, tenant cap, recovering
    held_back_by: dict[str, int] = field(default_factory=dict)
    #: the same, per tenant (tenant -> reason -> how many): what a tenant is shown of it
    held_back_by_tenant: dict[str, dict[str, int]] = field(default_factory=dict)


class Admission(Protocol):
    async def admit(
        self, candidates: Sequence[Candidate], now: float, *, limit: int | None = None
    ) -> list[Permit]:
        """Choose, in dispatch order, at most ``limit`` candidates every limit admits now, and
        reserve their quota atomically. Never exceeds a limit; may admit none."""
        ...

    async def renew(self, permits: Sequence[Permit], ttl_s: float | None = None) -> list[str]:
        """Keep the concurrency slots of running tasks alive (with the lease heartbeat);
        returns the task ids whose slot was already gone."""
        ...

    async def release_slots(self, permit: Permit) -> None:
        """Free a permit's slots only (a dead worker's task, reconciled by the sweeper)."""
        ...

    async def hold(self, permit: Permit, until: float) -> None:
        """Keep the permit's provider slot until ``until`` (a call that may still be running
        at the provider, its worker dead, still counts); free the rest."""
        ...

    def permit_for(self, task_id: str, kind: str, tenant: str, cost: float) -> Permit:
        """The permit a task of ``kind`` holds, rebuilt from its row by another process."""
        ...

    async def sending(self, permit: Permit) -> Permit:
        """The task's call is about to go out: its permit, with what the limits need to know
        of the moment it was sent (the calls in flight then)."""
        ...

    async def settle(self, permit: Permit, settlement: Settlement, now: float) -> None:
        """The task stopped using the provider (or reported usage): release and adjust."""
        ...

    async def release(self, permit: Permit, now: float) -> None:
        """Give back a permit whose claim was lost (another worker took the task)."""
        ...

    def next_admission_in(self, now: float) -> float | None:
        """Seconds until something held back could be admitted (None: only on a release)."""
        ...

    async def room(self, kinds: Sequence[str]) -> Room:
        """The kinds among ``kinds`` whose resource has a free concurrency slot now (or no
        in-flight cap), and how many slots they have free: one slot count per resource, so a
        dispatcher lists and admits only work that could start, not the queue of every full
        resource on every slot freed elsewhere."""
        ...

    @property
    def limited(self) -> bool:
        """False when nothing is limited: the dispatcher may claim without listing first."""
        ...

    def check_fits(self, resource: str | None, cost: float) -> None:
        """Refuse (:class:`~floodway.limits.plan.CostTooLarge`) at submit a task that no bucket
        of its resource could ever admit: it would wait forever."""
        ...

    async def snapshot(self) -> dict[str, ResourceSnapshot]:
        """Each resource's limits and state now, for stats and metrics."""
        ...

    async def aclose(self) -> None:
        """Release what the limits hold (a Redis connection pool)."""
        ...


class NoLimits:
    """Admits everything: the embedded default when no resource or tenant limit is set."""

    limited = False

    async def admit(
        self, candidates: Sequence[Candidate], now: float, *, limit: int | None = None
    ) -> list[Permit]:
        chosen = candidates if limit is None else candidates[:limit]
        return [Permit(c.task_id, None, c.tenant, c.cost) for c in chosen]

    async def renew(self, permits: Sequence[Permit], ttl_s: float | None = None) -> list[str]:
        return []

    async def release_slots(self, permit: Permit) -> None:
        return None

    async def hold(self, permit: Permit, until: float) -> None:
        return None

    def permit_for(self, task_id: str, kind: str, tenant: str, cost: float) -> Permit:
        return Permit(task_id, None, tenant, cost)

    async def sending(self, permit: Permit) -> Permit:
        return permit

    async def settle(self, permit: Permit, settlement: Settlement, now: float) -> None:
        return None

    async def release(self, permit: Permit, now: float) -> None:
        return None

    def next_admission_in(self, now: float) -> float | None:
        return None

    async def room(self, kinds: Sequence[str]) -> Room:
        return Room(tuple(kinds), None)

    def check_fits(self, resource: str | None, cost: float) -> None:
        return None

    async def snapshot(self) -> dict[str, ResourceSnapshot]:
        return {}

    async def aclose(self) -> None:
        return None
