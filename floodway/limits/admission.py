"""Admission control over provider resources and tenants: the :class:`Admission` the dispatcher
uses whenever any limit is configured.

For each ready candidate, in dispatch order (:mod:`floodway.limits.order`), one backend
``acquire`` takes everything the task needs at once: its resource's concurrency slot, one
request from the requests/min bucket, its estimated cost from the tokens/min bucket, and a slot
of its tenant's in-flight cap, provided the resource is not paused. All or nothing, so a refused
candidate holds nothing and stays queued.

What a refusal teaches is remembered for the rest of the pass, so a full dimension costs one
round trip, not one per candidate: a full slot set or a closed gate skips every later candidate
that needs it; a bucket that refused cost ``c`` skips later candidates costing ``c`` or more.
And a refusal can *reserve* a bucket: when an aged candidate (see :func:`order.aged`) or an
interactive one is refused by buckets alone, smaller candidates may no longer drain those
buckets (for an interactive one: no background candidate may), so the refused one is admitted as
soon as the refill covers it instead of being starved by a stream of small tasks.

After the call, :meth:`LimitsAdmission.settle` squares the books: tokens to the actual usage,
slots released, and on a 429 the whole resource is paused (Retry-After), its buckets emptied
and, if ``adaptive``, its rates halved (AIMD; recovered by +5 % per quiet window).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from floodway.clock import Clock
from floodway.config import ResourceConfig, TenantConfig
from floodway.core.errors import InvalidInput, LimiterUnavailable
from floodway.core.task import Candidate, Lane
from floodway.limits import order
from floodway.limits.backend import (
    RECOVERING,
    AcquireRequest,
    AcquireResult,
    Debit,
    LimiterBackend,
    SlotClaim,
)
from floodway.limits.base import BucketSnapshot, Permit, ResourceSnapshot, Settlement
from floodway.limits.headers import exhausted_pause, read_remaining
from floodway.limits.plan import BucketPlan, ResourcePlan, tenant_slot_key

log = logging.getLogger(__name__)

# Names in Permit.holds: what a permit took, so settle/release give back exactly that.
SLOT = "slot"  # 1.0: one of its resource's concurrency slots (slot id = task id)
TENANT_SLOT = "tenant_slot"  # 1.0: one of its tenant's in-flight slots
REQUESTS = "requests"  # 1.0 debited from the requests/min bucket
TOKENS = "tokens"  # the estimated cost debited from the tokens/min bucket
GRANTED_AT = "granted_at"  # backend time of the grant: one AIMD decrease per round trip
EPOCH = "epoch"  # the backend state's generation at the grant: lost slots are taken again


def orphan_slot(task_id: str) -> str:
    """The slot id of a task's call that may still run at the provider though its worker
    died: held apart from the task's own slot until the call could have ended."""
    return f"~{task_id}"


@dataclass(frozen=True)
class AdmissionTuning:
    """The knobs of the algorithms (the limits themselves come from the configuration)."""

    #: a candidate's effective cost falls to zero over this wait; past it, quota is reserved
    aging_s: float = 60.0
    #: a slot expires this long after it was taken or renewed unless :meth:`renew` runs, so a
    #: crashed worker's slots come back; keep it above the worker's lease
    slot_ttl_s: float = 120.0
    #: a slot taken at admission lasts this long until the claim that follows confirms it
    #: (:meth:`LimitsAdmission.renew`): a process that dies between the two orphans the slot,
    #: and its task cannot be admitted again, for this long only
    claim_ttl_s: float = 10.0
    #: the slot kept by ``keep_slot`` (an upstream job still running) lasts this long
    upstream_slot_ttl_s: float = 900.0
    decrease: float = 0.5  # multiplicative decrease on a 429
    floor: float = 0.05  # the rate factor never drops below this
    # Additive increase: +10 % of the configured rate per second of successes, so one halving
    # is undone in ~5 s. Slower recovery (the first cut: +5 % per 5 s) cost the demo 2.5x its
    # optimum when a provider sends the odd spontaneous 429.
    recovery_step: float = 0.1  # additive increase, as a share of the configured rate
    recovery_window_s: float = 1.0  # at most one increase per window of successes
    throttle_pause_s: float = 1.0  # pause after a 429 that named no Retry-After
    max_tenants: int = 4096  # tenants remembered for round-robin order


@dataclass
class _Counters:
    throttles: int = 0
    throttled_s: float = 0.0


@dataclass(frozen=True)
class _Attempt:
    plan: ResourcePlan | None
    request: AcquireRequest
    holds: dict[str, float]


@dataclass
class _Pass:
    """What one :meth:`LimitsAdmission.admit` learned from its refusals so far."""

    closed: set[str] = field(default_factory=set)  # full slot sets and paused gates
    floors: dict[str, float] = field(default_factory=dict)  # bucket -> least cost it refused
    reserved: set[str] = field(default_factory=set)  # buckets held for a refused candidate
    for_background: set[str] = field(default_factory=set)  # held by refused interactive ones
    wait: float | None = None  # least retry_in among the refusals
    recovering: bool = False  # the backend lost its state: it admits nothing for a while

    def blocked(self, request: AcquireRequest) -> bool:
        if self.recovering:
            return True
        if any(g in self.closed for g in request.gates):
            return True
        if any(s.key in self.closed for s in request.slots):
            return True
        for d in request.debits:
            key = d.bucket.key
            if key in self.reserved or d.cost >= self.floors.get(key, math.inf):
                return True
        return False

    def refused(self, request: AcquireRequest, result: AcquireResult, *, reserve: bool) -> None:
        costs = {d.bucket.key: d.cost for d in request.debits}
        self.recovering = self.recovering or RECOVERING in result.refused
        for key in result.refused:
            if key in result.held:
                continue  # this very task holds that slot already: nothing learned about others
            if key in costs:
                self.floors[key] = min(self.floors.get(key, math.inf), costs[key])
            else:
                self.closed.add(key)
        if result.retry_in is not None:
            self.wait = result.retry_in if self.wait is None else min(self.wait, result.retry_in)
        if reserve and _buckets_only(request, result):
            self.reserved.update(result.refused)

    def hold_for_background(self, request: AcquireRequest, result: AcquireResult) -> None:
        if _buckets_only(request, result):
            self.for_background.update(result.refused)


def _buckets_only(request: AcquireRequest, result: AcquireResult) -> bool:
    """Refused by buckets alone, and they will refill enough: worth holding them for it (a
    cost no bucket can ever hold must not hold anything back)."""
    buckets = {d.bucket.key for d in request.debits}
    return (
        bool(result.refused)
        and result.retry_in is not None
        and all(k in buckets for k in result.refused)
    )


class LimitsAdmission:
    """Resource and tenant limits over a :class:`LimiterBackend`."""

    def __init__(
        self,
        resources: Mapping[str, ResourceConfig],
        kinds: Mapping[str, str],
        tenants: TenantConfig,
        backend: LimiterBackend,
        clock: Clock,
        tuning: AdmissionTuning | None = None,
    ) -> None:
        self._plans = {name: ResourcePlan.build(name, cfg) for name, cfg in resources.items()}
        self._kinds = kinds  # kind -> resource name; read on every use (kinds may come later)
        self._tenant_cap = tenants.concurrency
        self._backend = backend
        self._clock = clock
        self._tuning = tuning or AdmissionTuning()
        self._rotation = order.Rotation(self._tuning.max_tenants)
        self._factors: dict[str, float] = {}  # last adaptive factor read or set, per resource
        self._counters = {name: _Counters() for name in self._plans}
        self._retry_at: float | None = None

    @property
    def backend(self) -> LimiterBackend:
        return self._backend

    @property
    def plans(self) -> Mapping[str, ResourcePlan]:
        return self._plans

    @property
    def limited(self) -> bool:
        return bool(self._tenant_cap) or any(p.limited for p in self._plans.values())

    # -- the Admission protocol ---------------------------------------------------------------
    async def admit(
        self, candidates: Sequence[Candidate], now: float, *, limit: int | None = None
    ) -> list[Permit]:
        """Permits in dispatch order. ``limit`` stops after that many (the dispatcher's free
        capacity), which saves reserving what would only be released again."""
        self._retry_at = None
        unique = list({c.task_id: c for c in candidates}.values())
        if not unique or limit == 0:
            return []
        await self._refresh_factors(unique)
        scan = _Pass()
        permits: list[Permit] = []
        for lane in (Lane.INTERACTIVE, Lane.BACKGROUND):
            if limit is not None and len(permits) >= limit:
                break
            if lane is Lane.BACKGROUND:
                scan.reserved |= scan.for_background
            rounds = order.lane_rounds(unique, lane, now, self._tuning.aging_s, self._rotation)
            for c in rounds:
                if limit is not None and len(permits) >= limit:
                    break
                attempt = self._attempt(c)
                if scan.blocked(attempt.request):
                    continue
                try:
                    result = await self._backend.acquire(attempt.request)
                except LimiterUnavailable:
                    if permits:  # what was granted is real: hand it over, fail on the next call
                        return permits
                    raise
                if result.granted:
                    holds = {**attempt.holds, GRANTED_AT: result.at, EPOCH: result.epoch}
                    name = attempt.plan.name if attempt.plan else None
                    permits.append(Permit(c.task_id, name, c.tenant, c.cost, holds))
                    rounds.admitted()
                    self._rotation.served(c.tenant)
                    continue
                aged = order.aged(c, now, self._tuning.aging_s)
                scan.refused(attempt.request, result, reserve=aged)
                if lane is Lane.INTERACTIVE:
                    scan.hold_for_background(attempt.request, result)
        if scan.wait is not None:
            self._retry_at = now + scan.wait
        return permits

    async def settle(self, permit: Permit, settlement: Settlement, now: float) -> None:
        """Best effort: if the backend is unreachable this logs and returns. Nothing is lost
        that would loosen a limit: an unreleased slot expires, an unrefunded bucket refills."""
        try:
            await self._settle(permit, settlement, now)
        except LimiterUnavailable as exc:
            log.warning("could not settle the permit of %s: %s", permit.task_id, exc)

    async def release(self, permit: Permit, now: float) -> None:
        """Best effort, like :meth:`settle`."""
        try:
            plan = self._plan(permit.resource)
            if plan is not None:
                factor = self._factor(plan)
                for bucket, hold in ((plan.requests, REQUESTS), (plan.tokens, TOKENS)):
                    taken = permit.holds.get(hold, 0.0)
                    if bucket is not None and taken:
                        await self._backend.settle(bucket.at(factor), -taken)
            await self.release_slots(permit)
        except LimiterUnavailable as exc:
            log.warning("could not release the permit of %s: %s", permit.task_id, exc)

    def next_admission_in(self, now: float) -> float | None:
        return None if self._retry_at is None else max(0.0, self._retry_at - now)

    async def saturated(self, kinds: Sequence[str]) -> bool:
        """One slot count per resource. A kind without a concurrency cap is never saturated,
        nor is a resource limited only by buckets (their refill is timed, not signalled)."""
        names = {self._kinds.get(k) for k in kinds}
        plans = [self._plan(n) for n in names]
        if not plans or any(p is None or not p.concurrency for p in plans):
            return False
        for plan in plans:
            assert plan is not None
            cap = plan.concurrency_at(self._factor(plan))
            if await self._backend.slots_in_use(plan.slot_key) < cap:
                return False
        self._retry_at = None  # only a release can help now: no timed wake-up
        return True

    # -- for the engine -----------------------------------------------------------------------
    def check_fits(self, resource: str | None, cost: float) -> None:
        """Refuse at submit a task that no bucket could ever admit (it would wait forever)."""
        if cost < 0 or math.isnan(cost):
            raise InvalidInput(f"a task's cost must be a non-negative number, not {cost!r}")
        plan = self._plan(resource)
        if plan is not None:
            plan.check_fits(cost)

    async def renew(self, permits: Sequence[Permit], ttl_s: float | None = None) -> list[str]:
        """Extend the slots of running tasks. Call it once the task is claimed (a slot taken at
        admission lasts only ``claim_ttl_s``) and with every lease heartbeat, or a task that
        outlives ``slot_ttl_s`` loses its slot and the limit could be exceeded. A slot the
        backend lost with its state is taken again. Returns the ids of tasks whose slot was
        gone for good (expired)."""
        ttl = self._tuning.slot_ttl_s if ttl_s is None else ttl_s
        lost: list[str] = []
        for permit in permits:
            taken_in = permit.holds.get(EPOCH, 0.0)
            for key in self._slot_keys(permit, self._plan(permit.resource)):
                renewed = await self._backend.renew_slot(
                    key, permit.task_id, ttl, taken_in=taken_in
                )
                if not renewed and permit.task_id not in lost:
                    lost.append(permit.task_id)
        return lost

    async def release_slots(self, permit: Permit) -> None:
        """Free a permit's slots and nothing else: for the sweeper, when a dead worker's task
        is reconciled (its tokens may well have been spent upstream) or its orphaned call has
        surely ended."""
        plan = self._plan(permit.resource)
        for key in self._slot_keys(permit, plan):
            await self._backend.release_slot(key, permit.task_id)
        if plan is not None and permit.holds.get(SLOT):
            await self._backend.release_slot(plan.slot_key, orphan_slot(permit.task_id))

    async def hold(self, permit: Permit, until: float) -> None:
        """Keep the permit's provider slot until ``until`` (taken again, over the limit if need
        be, when it was lost): a call whose end floodway cannot see, its worker having died
        mid-call, still counts at the provider. Its tenant slot is freed: tenant caps are
        floodway's fairness, not the provider's limit. Best effort, like :meth:`settle`."""
        plan = self._plan(permit.resource)
        ttl = until - self._clock.now()
        try:
            if plan is not None and permit.holds.get(SLOT):
                # Held under the call's own id, apart from the task's: the task may run again
                # (its resubmission takes this slot over) while the call is still counted.
                if ttl > 0:
                    await self._backend.hold_slot(plan.slot_key, orphan_slot(permit.task_id), ttl)
                await self._backend.release_slot(plan.slot_key, permit.task_id)
            if permit.holds.get(TENANT_SLOT):
                await self._backend.release_slot(tenant_slot_key(permit.tenant), permit.task_id)
        except LimiterUnavailable as exc:
            log.warning("could not hold the slot of %s: %s", permit.task_id, exc)

    def permit_for(self, task_id: str, kind: str, tenant: str, cost: float) -> Permit:
        """The permit an admitted task of this kind holds, rebuilt from the task row, so
        another process (a webhook, a sweeper) can settle or release it."""
        plan = self._plan(self._kinds.get(kind))
        holds: dict[str, float] = {GRANTED_AT: 0.0}
        if plan is not None:
            if plan.concurrency:
                holds[SLOT] = 1.0
            if plan.requests is not None:
                holds[REQUESTS] = 1.0
            if plan.tokens is not None and cost > 0:
                holds[TOKENS] = cost
        if self._tenant_cap:
            holds[TENANT_SLOT] = 1.0
        return Permit(task_id, plan.name if plan else None, tenant, cost, holds)

    async def snapshot(self) -> dict[str, ResourceSnapshot]:
        out: dict[str, ResourceSnapshot] = {}
        hint = self.next_admission_in(self._clock.now())
        for name, plan in self._plans.items():
            factor = await self._backend.rate_factor(plan.rate_key) if plan.adaptive else 1.0
            self._factors[name] = factor
            in_flight = await self._backend.slots_in_use(plan.slot_key) if plan.concurrency else 0
            out[name] = ResourceSnapshot(
                concurrency=plan.concurrency_at(factor) if plan.concurrency else 0,
                in_flight=in_flight,
                requests=await self._bucket_snapshot(plan.requests, factor),
                tokens=await self._bucket_snapshot(plan.tokens, factor),
                rate_factor=factor,
                paused_for=await self._backend.paused_for(plan.gate_key),
                throttled_s=self._counters[name].throttled_s,
                throttles=self._counters[name].throttles,
                next_admission_in=hint,
            )
        return out

    async def aclose(self) -> None:
        await self._backend.aclose()

    # -- internals ----------------------------------------------------------------------------
    async def _settle(self, permit: Permit, settlement: Settlement, now: float) -> None:
        plan = self._plan(permit.resource)
        if plan is not None:
            if plan.tokens is not None and settlement.actual_cost is not None:
                delta = settlement.actual_cost - permit.holds.get(TOKENS, 0.0)
                if delta:
                    await self._backend.settle(plan.tokens.at(self._factor(plan)), delta)
            # Pause before releasing the slot: nothing may slip into the freed slot first.
            if settlement.throttled:
                await self._throttled(plan, permit, settlement)
            elif plan.adaptive and self._factor(plan) < 1.0:
                self._factors[plan.name] = await self._backend.increase_rate(
                    plan.rate_key,
                    step=self._tuning.recovery_step,
                    cap=1.0,
                    interval_s=self._tuning.recovery_window_s,
                )
            if settlement.headers:
                await self._resync(plan, permit, settlement.headers, now)
        if settlement.keep_slot:
            await self.renew([permit], self._tuning.upstream_slot_ttl_s)
        elif settlement.still_running_s is not None:
            await self.hold(permit, self._clock.now() + settlement.still_running_s)
        else:
            await self.release_slots(permit)

    def _plan(self, resource: str | None) -> ResourcePlan | None:
        # A resource named by a kind but not configured limits nothing.
        return None if resource is None else self._plans.get(resource)

    def _factor(self, plan: ResourcePlan) -> float:
        return self._factors.get(plan.name, 1.0) if plan.adaptive else 1.0

    async def _refresh_factors(self, candidates: Sequence[Candidate]) -> None:
        """Read each adaptive resource's shared factor once per pass (another process may
        have changed it)."""
        names = {self._kinds.get(c.kind) for c in candidates}
        for name in names:
            plan = self._plan(name)
            if plan is not None and plan.adaptive:
                self._factors[plan.name] = await self._backend.rate_factor(plan.rate_key)

    def _attempt(self, c: Candidate) -> _Attempt:
        plan = self._plan(self._kinds.get(c.kind))
        ttl = self._tuning.claim_ttl_s
        holds: dict[str, float] = {}
        gates: tuple[str, ...] = ()
        slots: list[SlotClaim] = []
        debits: list[Debit] = []
        if plan is not None:
            factor = self._factor(plan)
            gates = (plan.gate_key,)
            if plan.concurrency:
                cap = plan.concurrency_at(factor)
                # A resubmission inherits the slot its own orphaned call still holds.
                slots.append(SlotClaim(plan.slot_key, cap, c.task_id, ttl, orphan_slot(c.task_id)))
                holds[SLOT] = 1.0
            if plan.requests is not None:
                debits.append(Debit(plan.requests.at(factor), 1.0))
                holds[REQUESTS] = 1.0
            if plan.tokens is not None and c.cost > 0:
                debits.append(Debit(plan.tokens.at(factor), c.cost))
                holds[TOKENS] = c.cost
        if self._tenant_cap:
            slots.append(SlotClaim(tenant_slot_key(c.tenant), self._tenant_cap, c.task_id, ttl))
            holds[TENANT_SLOT] = 1.0
        return _Attempt(plan, AcquireRequest(tuple(debits), tuple(slots), gates), holds)

    def _slot_keys(self, permit: Permit, plan: ResourcePlan | None) -> list[str]:
        keys = []
        if plan is not None and permit.holds.get(SLOT):
            keys.append(plan.slot_key)
        if permit.holds.get(TENANT_SLOT):
            keys.append(tenant_slot_key(permit.tenant))
        return keys

    async def _throttled(self, plan: ResourcePlan, permit: Permit, settlement: Settlement) -> None:
        """A 429: the provider is full now, whatever our buckets believe."""
        counters = self._counters[plan.name]
        counters.throttles += 1
        pause = settlement.retry_after
        if pause is None:
            pause = self._tuning.throttle_pause_s
        if pause > 0:
            counters.throttled_s += await self._backend.pause(plan.gate_key, pause)
        if plan.adaptive:
            self._factors[plan.name] = await self._backend.decrease_rate(
                plan.rate_key,
                multiplier=self._tuning.decrease,
                floor=self._tuning.floor,
                granted_at=permit.holds.get(GRANTED_AT, 0.0),
            )
        factor = self._factor(plan)
        for bucket in plan.buckets():
            await self._backend.clamp(bucket.at(factor), 0.0)

    async def _resync(
        self, plan: ResourcePlan, permit: Permit, headers: Mapping[str, str], now: float
    ) -> None:
        """Lower our buckets to what the provider says is left (never raise them). A dimension
        we do not meter, reported exhausted, pauses the resource instead."""
        factor = self._factor(plan)
        for r in read_remaining(headers, now):
            bucket: BucketPlan | None = plan.requests if r.dimension == REQUESTS else plan.tokens
            if bucket is not None:
                if r.remaining < bucket.capacity:
                    await self._backend.clamp(bucket.at(factor), r.remaining)
                continue
            need = 1.0 if r.dimension == REQUESTS else permit.cost
            pause = exhausted_pause(r, need)
            if pause:
                added = await self._backend.pause(plan.gate_key, pause)
                self._counters[plan.name].throttled_s += added

    async def _bucket_snapshot(
        self, plan: BucketPlan | None, factor: float
    ) -> BucketSnapshot | None:
        if plan is None:
            return None
        bucket = plan.at(factor)
        level = await self._backend.level(bucket)
        return BucketSnapshot(bucket.capacity, level, bucket.refill_per_s)
