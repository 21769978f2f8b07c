"""The limiter backend seam: a few atomic primitives the limit algorithms are built from.

A backend knows nothing of tasks, tenants or providers. It keeps three kinds of state under
string keys and changes each atomically:

* **token buckets** (a level and the time it was measured; refilled lazily on every touch),
* **concurrency slots** (a set of slot ids, each with an expiry, so a crashed process cannot
  leak a slot: its entries simply expire),
* **gates** (a pause until some instant, for Retry-After),
* **estimates**: one hash per resource of what the fleet learned about the provider's limits
  (a learned in-flight cap, learned rates, the figures its rate-limit headers published) and a
  **meter** of its sending rate (decaying counts of requests sent and of 429s), so every process
  enforces the same estimate.

A shared backend can lose its state (a Redis restarted without persistence). Its **generation**
(:attr:`AcquireResult.epoch`) then changes: slots taken in an older generation are taken again
when their holders renew them (the calls are still running, so they still count), and the
backend admits nothing for a short recovery window so that every live holder renews first.

:meth:`LimiterBackend.acquire` is the heart: one request spans several buckets, slots and gates
and is all-or-nothing, so a task is admitted only when every dimension admits it, and a refused
request changes nothing. Two implementations: :mod:`floodway.limits.local` (one process) and
:mod:`floodway.limits.redis_backend` (Lua scripts on one Redis, shared by every process).

Durations cross this seam, never instants: each backend measures time with its own clock (the
injected :class:`~floodway.clock.Clock` locally, the Redis server's ``TIME`` in Lua), so host
clocks need not agree. The one instant that leaves a backend, :attr:`AcquireResult.at`, is only
ever handed back to the same backend (:meth:`LimiterBackend.cut`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

#: The key a refusal names while the backend recovers from a loss of its state.
RECOVERING = "recovering"


@dataclass(frozen=True)
class Bucket:
    """A token bucket: holds at most ``capacity``, refills at ``refill_per_s``; starts full."""

    key: str
    capacity: float
    refill_per_s: float


@dataclass(frozen=True)
class Debit:
    """Take ``cost`` from ``bucket``. ``lag_s``: the call this pays for reaches the provider up
    to this long after the take, and the provider's own bucket, full until it arrives, refills
    only from then: a take leaves at most ``capacity - lag_s x refill`` (less the cost), so the
    refill of a full bucket starts ``lag_s`` late, as the provider's does. Below that level
    (the bucket has been drawing) when a take happens does not matter, and nothing is lost."""

    bucket: Bucket
    cost: float
    lag_s: float = 0.0

    def level_after(self, level: float) -> float:
        b = self.bucket
        return min(level, b.capacity - self.lag_s * b.refill_per_s) - self.cost


@dataclass(frozen=True)
class SlotClaim:
    """Take one of ``limit`` slots under ``key`` for ``slot_id`` until ``ttl_s`` from now.

    A slot id already holding a slot is refused (reported in :attr:`AcquireResult.held`): two
    processes admitting the same task must not both believe they own its one slot.

    ``replaces``: the slot id of an earlier holding of the same work (a call its dead worker
    left running at the provider, held until it could have ended). The claim takes that slot
    over instead of a free one: a resubmission the provider joins to the same job adds nothing
    at the provider, so it needs no room of its own."""

    key: str
    limit: int
    slot_id: str
    ttl_s: float
    replaces: str = ""


@dataclass(frozen=True)
class Meter:
    """A resource's sending-rate meter: decaying counts with time constant ``tau_s``, so a
    count divided by ``tau_s`` reads as a rate over about the last ``tau_s`` seconds."""

    key: str
    tau_s: float


#: the meter's fields: requests sent (counted by a granted acquire) and 429s (by :meth:`tick`)
SENT = "sent"
THROTTLED = "throttled"
#: the same counts over a window SLOW times as long (time constant ``SLOW * tau_s``): the rate
#: a provider sustains, where a burst it allowed inflates the short window's
SLOW = 4.0
SENT_SLOW = "sent:slow"
THROTTLED_SLOW = "throttled:slow"
#: the meter's fields, each with its time constant as a multiple of ``tau_s``
METER_FIELDS = ((SENT, 1.0), (THROTTLED, 1.0), (SENT_SLOW, SLOW), (THROTTLED_SLOW, SLOW))
#: the slow window's field beside each counted one
SLOW_OF = {SENT: SENT_SLOW, THROTTLED: THROTTLED_SLOW}
#: a probe's step doubles with each grow since the last cut, at most this many times
MAX_DOUBLINGS = 16


@dataclass(frozen=True)
class AcquireRequest:
    """Everything one task needs, taken together or not at all."""

    debits: tuple[Debit, ...] = ()
    slots: tuple[SlotClaim, ...] = ()
    gates: tuple[str, ...] = ()  # pause keys that must not be closed
    meter: Meter | None = None  # counts one request sent when granted


@dataclass(frozen=True)
class AcquireResult:
    granted: bool
    #: the backend's time of the decision (seconds); only meaningful to the same backend
    at: float
    #: keys of every dimension that said no (gates, slots and buckets alike); empty if granted
    refused: tuple[str, ...] = ()
    #: slot keys that refused because this slot id already holds a slot there
    held: tuple[str, ...] = ()
    #: seconds until every refusing bucket and gate could admit this request; None when a slot
    #: refused (only a release can help) or a bucket can never hold the cost
    retry_in: float | None = None
    #: the generation of the backend's state this decision was made in (see the module doc);
    #: hand it back to :meth:`LimiterBackend.renew_slot`
    epoch: float = 0.0
    #: slots in use under each claimed key once this grant took its own (empty if refused)
    in_use: tuple[int, ...] = ()


class LimiterBackend(Protocol):
    async def now(self) -> float:
        """The backend's own time, in seconds."""
        ...

    async def acquire(self, request: AcquireRequest) -> AcquireResult:
        """Debit every bucket and take every slot, or change nothing and say what refused.

        While the backend recovers from a loss of its state, every request is refused with
        :data:`RECOVERING` among the refused keys."""
        ...

    async def settle(self, bucket: Bucket, delta: float) -> float:
        """Debit (``delta > 0``) or refund (``delta < 0``) a bucket; return the new level.

        A refund never lifts the level above capacity; a debit may take it below zero (debt),
        which later acquisitions must repay before they are admitted."""
        ...

    async def clamp(self, bucket: Bucket, ceiling: float) -> float:
        """Lower the level to ``ceiling`` if it is above (never raises it); return the level."""
        ...

    async def level(self, bucket: Bucket) -> float:
        """The level now, refill included (read only)."""
        ...

    async def release_slot(self, key: str, slot_id: str) -> bool:
        """Give a slot back; False if it was not held (released already, or expired)."""
        ...

    async def renew_slot(
        self, key: str, slot_id: str, ttl_s: float, *, taken_in: float = 0.0
    ) -> bool:
        """Push a held slot's expiry to ``ttl_s`` from now; False if it is no longer held.

        ``taken_in`` is the :attr:`AcquireResult.epoch` of the grant (0 = unknown). A slot gone
        because the state was lost since then is taken again, over the limit if need be: its
        call is running and must count. A slot gone within its own generation was released or
        expired, and stays gone."""
        ...

    async def hold_slot(self, key: str, slot_id: str, ttl_s: float) -> None:
        """Hold ``slot_id`` under ``key`` until ``ttl_s`` from now at least, taking it even
        over the limit: it stands for a call running at the provider that must count."""
        ...

    async def slots_in_use(self, key: str) -> int:
        """Slots held and not expired."""
        ...

    async def estimates(self, key: str, meter: Meter | None = None) -> dict[str, float]:
        """Every field of a resource's estimates hash (see :mod:`floodway.limits.learning`),
        with the meter's counts decayed to now when ``meter`` is given. Empty if none."""
        ...

    async def cut(
        self, key: str, field: str, value: float, *, floor: float, granted_at: float
    ) -> float:
        """Lower an estimate to ``value`` (not below ``floor``; an absent one is set) unless it
        already changed after ``granted_at`` (an :attr:`AcquireResult.at`): the refused
        request was sent under the old estimate, so it says nothing about the new one. One cut
        per round trip, however many requests of that round were refused. Records when it
        changed (``<field>:t``) and when it was cut (``<field>:c``, in seconds, as
        :attr:`AcquireResult.at`), the value cut to
        (``<field>:b``, the base of later steps), counts the cuts (``<field>:n``) and restarts
        the probe's doubling (``<field>:k`` = 0). Returns the estimate."""
        ...

    async def grow(
        self,
        key: str,
        field: str,
        *,
        start: float,
        step: float,
        cap: float,
        interval_s: float,
        quiet_s: float = 0.0,
    ) -> float:
        """Probe an estimate upward (``start`` when absent), at most once per ``interval_s``
        since it last changed. Once it has been cut, nothing for ``quiet_s`` after the cut,
        then ``step`` doubled for each grow since the cut (``<field>:k``): a limit that held
        is probed in small steps, a raised one is found in a few windows. Reaching ``cap``
        removes it: the configured or published limit is in force again. Returns the
        estimate (``cap`` once removed)."""
        ...

    async def note(self, key: str, fields: dict[str, float]) -> None:
        """Set fields of the estimates hash as they are (a provider's published figures)."""
        ...

    async def tick(self, meter: Meter, field: str) -> None:
        """Count one event (a 429) in a resource's meter."""
        ...

    async def pause(self, key: str, seconds: float) -> float:
        """Close a gate for ``seconds`` from now, never shortening a longer pause; returns the
        seconds this call added to the pause (0 when an existing pause already covered it)."""
        ...

    async def paused_for(self, key: str) -> float:
        """Seconds until the gate opens (0 when open)."""
        ...

    async def aclose(self) -> None: ...
