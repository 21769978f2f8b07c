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

from floodway.store.base import Candidate


@dataclass(frozen=True)
class Permit:
    """What one admitted task holds: a concurrency slot and/or tokens, per dimension."""

    task_id: str
    resource: str | None
    tenant: str
    cost: float
    holds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Settlement:
    """How the call went, so the limiter can refund, debit and adapt."""

    actual_cost: float | None = None
    throttled: bool = False  # the provider answered 429
    retry_after: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # x-ratelimit-* and friends
    keep_slot: bool = False  # an upstream job still runs: keep the concurrency slot
    #: the provider's error type and message, when it refused: "too many concurrent requests"
    #: tells a concurrency limit from a rate limit
    reason: str = ""


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

    def permit_for(self, task_id: str, kind: str, tenant: str, cost: float) -> Permit:
        """The permit a task of ``kind`` holds, rebuilt from its row by another process."""
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

    async def saturated(self, kinds: Sequence[str]) -> bool:
        """True when no task of these kinds could be admitted now for want of a concurrency
        slot (every kind's resource has all its slots in use): a cheap look that spares a
        blocked dispatcher the listing and the admission pass on every wake-up."""
        ...

    @property
    def limited(self) -> bool:
        """False when nothing is limited: the dispatcher may claim without listing first."""
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

    def permit_for(self, task_id: str, kind: str, tenant: str, cost: float) -> Permit:
        return Permit(task_id, None, tenant, cost)

    async def settle(self, permit: Permit, settlement: Settlement, now: float) -> None:
        return None

    async def release(self, permit: Permit, now: float) -> None:
        return None

    def next_admission_in(self, now: float) -> float | None:
        return None

    async def saturated(self, kinds: Sequence[str]) -> bool:
        return False
