"""The in-process limiter backend: plain dicts, for one process (the embedded mode).

Every method is ``async`` to fit the seam but never awaits: under asyncio one coroutine runs at
a time, so each method body is one atomic step, which is all the atomicity the seam asks for.
Time comes from the injected clock, so tests drive refills and expiries with a fake clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from floodway.clock import Clock
from floodway.limits.backend import (
    MAX_DOUBLINGS,
    METER_FIELDS,
    SENT,
    SLOW_OF,
    AcquireRequest,
    AcquireResult,
    Bucket,
    Meter,
)


@dataclass
class _Level:
    level: float
    at: float
    capacity: float
    refill_per_s: float

    def full_at(self, now: float) -> bool:
        return self.level + max(0.0, now - self.at) * self.refill_per_s >= self.capacity


#: sweep forgotten state every this many writes (the dicts would otherwise grow with every
#: tenant ever seen, where Redis lets such keys expire)
SWEEP_EVERY = 1024

#: The state's generation: it lives and dies with the process, so it never changes.
EPOCH = 1.0


class LocalLimiterBackend:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._writes = 0
        self._buckets: dict[str, _Level] = {}
        self._slots: dict[str, dict[str, float]] = {}  # key -> slot id -> expiry
        self._estimates: dict[str, dict[str, float]] = {}
        self._gates: dict[str, float] = {}  # key -> paused until

    async def now(self) -> float:
        return self._clock.now()

    # -- acquire: check everything, then change everything --------------------------------
    async def acquire(self, request: AcquireRequest) -> AcquireResult:
        now = self._clock.now()
        refused: list[str] = []
        held: list[str] = []
        wait: float | None = 0.0

        for gate in request.gates:
            left = self._gates.get(gate, 0.0) - now
            if left > 0:
                refused.append(gate)
                wait = None if wait is None else max(wait, left)

        for claim in request.slots:
            slots = self._live_slots(claim.key, now)
            if claim.slot_id in slots:
                held.append(claim.key)
            inherits = bool(claim.replaces) and claim.replaces in slots
            if claim.slot_id in slots or (len(slots) >= claim.limit and not inherits):
                refused.append(claim.key)
                wait = None

        levels: list[float] = []
        for debit in request.debits:
            level = self._refilled(debit.bucket, now)
            levels.append(level)
            if level < debit.cost:
                refused.append(debit.bucket.key)
                wait = _combine(wait, _bucket_wait(debit.bucket, level, debit.cost))

        if refused:
            return AcquireResult(False, now, tuple(refused), tuple(held), wait, EPOCH)

        in_use = []
        for claim in request.slots:
            slots = self._slots.setdefault(claim.key, {})
            slots.pop(claim.replaces, None)
            slots[claim.slot_id] = now + claim.ttl_s
            in_use.append(len(slots))
        for debit, level in zip(request.debits, levels, strict=True):
            self._store(debit.bucket, debit.level_after(level), now)
        if request.meter is not None:
            self._count(request.meter, SENT, now)
        return AcquireResult(True, now, epoch=EPOCH, in_use=tuple(in_use))

    # -- buckets ----------------------------------------------------------------------------
    async def settle(self, bucket: Bucket, delta: float) -> float:
        now = self._clock.now()
        level = min(bucket.capacity, self._refilled(bucket, now) - delta)
        self._store(bucket, level, now)
        return level

    async def clamp(self, bucket: Bucket, ceiling: float) -> float:
        now = self._clock.now()
        level = min(self._refilled(bucket, now), ceiling)
        self._store(bucket, level, now)
        return level

    async def level(self, bucket: Bucket) -> float:
        return self._refilled(bucket, self._clock.now())

    # -- slots ------------------------------------------------------------------------------
    async def release_slot(self, key: str, slot_id: str) -> bool:
        slots = self._live_slots(key, self._clock.now())
        return slots.pop(slot_id, None) is not None

    async def renew_slot(
        self, key: str, slot_id: str, ttl_s: float, *, taken_in: float = 0.0
    ) -> bool:
        now = self._clock.now()
        slots = self._live_slots(key, now)
        if slot_id not in slots:  # released or expired: this state is never lost (see EPOCH)
            return False
        slots[slot_id] = max(slots[slot_id], now + ttl_s)
        return True

    async def hold_slot(self, key: str, slot_id: str, ttl_s: float) -> None:
        now = self._clock.now()
        slots = self._live_slots(key, now)
        slots[slot_id] = max(slots.get(slot_id, now), now + ttl_s)
        self._slots[key] = slots

    async def slots_in_use(self, key: str) -> int:
        return len(self._live_slots(key, self._clock.now()))

    # -- estimates ---------------------------------------------------------------------------
    async def estimates(self, key: str, meter: Meter | None = None) -> dict[str, float]:
        fields = dict(self._estimates.get(key, {}))
        if meter is not None:
            fields.update(_decayed(fields, meter, self._clock.now()))
        return fields

    async def cut(
        self, key: str, field: str, value: float, *, floor: float, granted_at: float
    ) -> float:
        now = self._clock.now()
        fields = self._estimates.setdefault(key, {})
        current = fields.get(field)
        if current is not None and fields.get(f"{field}:t", -math.inf) > granted_at:
            return current
        lowered = max(floor, value if current is None else min(current, value))
        fields[field] = fields[f"{field}:b"] = lowered
        fields[f"{field}:t"] = fields[f"{field}:c"] = now
        fields[f"{field}:n"] = fields.get(f"{field}:n", 0.0) + 1
        fields[f"{field}:k"] = 0.0
        return lowered

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
        now = self._clock.now()
        fields = self._estimates.setdefault(key, {})
        current = fields.get(field, start)
        if now - fields.get(f"{field}:t", -math.inf) < interval_s:
            return current
        cut_at = fields.get(f"{field}:c")
        if cut_at is not None:
            if now - cut_at < quiet_s:
                return current
            doublings = fields.get(f"{field}:k", 0.0)
            step *= 2.0 ** min(doublings, MAX_DOUBLINGS)
            fields[f"{field}:k"] = doublings + 1
        grown = current + step
        fields[f"{field}:t"] = now
        if grown >= cap:
            fields.pop(field, None)
            return cap
        fields[field] = grown
        return grown

    async def note(self, key: str, fields: dict[str, float]) -> None:
        self._estimates.setdefault(key, {}).update(fields)

    async def tick(self, meter: Meter, field: str) -> None:
        self._count(meter, field, self._clock.now())

    def _count(self, meter: Meter, field: str, now: float) -> None:
        fields = self._estimates.setdefault(meter.key, {})
        fields.update(_decayed(fields, meter, now))
        fields[field] += 1.0
        fields[SLOW_OF[field]] += 1.0
        fields["meter:t"] = now

    # -- gates ------------------------------------------------------------------------------
    async def pause(self, key: str, seconds: float) -> float:
        now = self._clock.now()
        until = self._gates.get(key, now)
        added = now + seconds - max(until, now)
        if added <= 0:
            return 0.0
        self._gates[key] = now + seconds
        return added

    async def paused_for(self, key: str) -> float:
        return max(0.0, self._gates.get(key, 0.0) - self._clock.now())

    async def aclose(self) -> None:
        return None

    # -- helpers ----------------------------------------------------------------------------
    def _store(self, bucket: Bucket, level: float, now: float) -> None:
        self._buckets[bucket.key] = _Level(level, now, bucket.capacity, bucket.refill_per_s)
        self._writes += 1
        if self._writes % SWEEP_EVERY == 0:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Drop what reads the same as absent: full buckets, empty slot sets, open gates."""
        for key in [k for k, b in self._buckets.items() if b.full_at(now)]:
            del self._buckets[key]
        for key in [k for k in self._slots if not self._live_slots(k, now)]:
            del self._slots[key]
        for key in [k for k, until in self._gates.items() if until <= now]:
            del self._gates[key]

    def _refilled(self, bucket: Bucket, now: float) -> float:
        state = self._buckets.get(bucket.key)
        if state is None:
            return bucket.capacity  # a bucket nobody touched yet is full
        elapsed = max(0.0, now - state.at)
        return min(bucket.capacity, state.level + elapsed * bucket.refill_per_s)

    def _live_slots(self, key: str, now: float) -> dict[str, float]:
        slots = self._slots.get(key)
        if slots is None:
            return {}
        # Purge on touch, like the Redis script: an expired slot belongs to a dead holder.
        for slot_id in [s for s, expiry in slots.items() if expiry <= now]:
            del slots[slot_id]
        return slots


def _decayed(fields: dict[str, float], meter: Meter, now: float) -> dict[str, float]:
    """The meter's counts as of ``now``: each decays by e^(-elapsed / its tau)."""
    elapsed = max(0.0, now - fields.get("meter:t", now))
    return {
        f: fields.get(f, 0.0) * math.exp(-elapsed / (share * meter.tau_s))
        for f, share in METER_FIELDS
    }


def _bucket_wait(bucket: Bucket, level: float, cost: float) -> float | None:
    """Seconds until ``level`` refills to ``cost``; None if it never will."""
    if cost > bucket.capacity or bucket.refill_per_s <= 0:
        return None
    return (cost - level) / bucket.refill_per_s


def _combine(wait: float | None, other: float | None) -> float | None:
    """The request waits for its slowest refusal; a None (never, or a release) wins."""
    if wait is None or other is None:
        return None
    return max(wait, other)
