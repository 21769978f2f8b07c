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
slots released, the provider's published figures read (:mod:`floodway.limits.headers`), and a
429 judged (:mod:`floodway.limits.learning`): a limit pauses the whole resource until its
Retry-After, empties its buckets and, if ``adaptive``, lowers the estimate of the dimension it
is about; noise costs the refused task its own Retry-After and nothing else. While a learned
limit holds work back and no 429 comes, it is probed upward (AIMD).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from floodway.clock import Clock
from floodway.config import ResourceConfig, TenantConfig
from floodway.core.errors import InvalidInput, LimiterUnavailable
from floodway.core.task import Candidate, Lane
from floodway.limits import order
from floodway.limits.backend import (
    RECOVERING,
    SENT,
    SENT_SLOW,
    SLOW,
    THROTTLED,
    THROTTLED_SLOW,
    AcquireRequest,
    AcquireResult,
    Bucket,
    Debit,
    LimiterBackend,
    Meter,
    SlotClaim,
)
from floodway.limits.base import (
    BucketSnapshot,
    LimitSnapshot,
    Permit,
    ResourceSnapshot,
    Room,
    Settlement,
)
from floodway.limits.headers import CONCURRENCY, REQUESTS, TOKENS, exhausted_pause, read_quotas
from floodway.limits.learning import (
    DIMENSIONS,
    HEADER,
    LEARNED,
    RATES,
    Limit,
    Persistence,
    Throttle,
    Verdict,
    cuts,
    in_force,
    judge,
    published,
)
from floodway.limits.plan import ResourcePlan, tenant_slot_key

log = logging.getLogger(__name__)

# Names in Permit.holds: what a permit took, so settle/release give back exactly that.
SLOT = "slot"  # 1.0: one of its resource's concurrency slots (slot id = task id)
TENANT_SLOT = "tenant_slot"  # 1.0: one of its tenant's in-flight slots
# REQUESTS: 1.0 debited from the requests bucket; TOKENS: the estimated cost from the tokens one
GRANTED_AT = "granted_at"  # backend time of the grant: one AIMD decrease per round trip
EPOCH = "epoch"  # the backend state's generation at the grant: lost slots are taken again
#: the resource's calls in flight once this one took its slot, counted again among the calls
#: sent when it is sent (:meth:`LimitsAdmission.sending`): what the provider saw
IN_FLIGHT = "in_flight"
SENT_SLOT = "sent"  # 1.0: the call is counted among its resource's calls sent
SENT_AT = "sent_at"  # backend time the call was counted as sent

#: why a candidate was held back, by the kind of key that refused it
PAUSE, TENANT = "pause", "tenant cap"
#: a resource with no in-flight limit in force still counts its calls, under this cap
UNCAPPED = 1_000_000
#: a grant time later than any: the cut applies whatever changed since
ANY_ROUND = 1e300
#: what held work back is shown while the pass that saw it is this recent (dispatchers pass
#: at least once a second while work waits)
HELD_FRESH_S = 5.0


def _summed(by_tenant: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in by_tenant.values():
        for reason, n in counts.items():
            total[reason] = total.get(reason, 0) + n
    return total


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
    #: a call reaches the provider up to this long after its admission (the claim's write, a
    #: connection opened, the handler's own start): a provider's token bucket, full until the
    #: call arrives, starts refilling only then, so a full bucket's refill starts this late
    #: here too (:class:`~floodway.limits.backend.Debit`). It costs this long once per burst
    #: from a full bucket, never while the rate binds.
    send_lag_s: float = 0.25
    #: the slot kept by ``keep_slot`` (an upstream job still running) lasts this long
    upstream_slot_ttl_s: float = 900.0
    #: a limit 429 lowers a rate to this share of what was achieved (or of its estimate)
    decrease: float = 0.9
    floor: float = 0.05  # a lowered configured or published rate stays above this share of it
    min_rate_per_s: float = 1 / 60  # a learned rate never drops below one request a minute
    deepest_cut: float = 0.5  # one limit 429 never lowers an estimate below this share of it
    #: an in-flight cap refused at a load its last cut allowed (the provider's cap came down)
    #: is cut to this share of the calls out
    in_flight_decrease: float = 0.7
    #: the first probe step of a lowered rate while it holds work back and no 429 comes: this
    #: share of the rate it was cut to; each later step of the probe doubles
    recovery_step: float = 0.1
    #: at most one probe step per window (rates and the in-flight cap alike)
    recovery_window_s: float = 1.0
    #: a configured or published rate lowered by a limit 429 starts at this share of it
    known_recovery_step: float = 0.1
    #: no probe for this long after a cut: a cut not deep enough shows its 429 first, and a
    #: limit that holds sees a probe only every few seconds
    probe_quiet_s: float = 5.0
    initial_concurrency: int = 4  # slow start: calls at once to a resource of unknown cap
    meter_tau_s: float = 1.0  # the sending-rate meter reads the last second or so
    least_sample: float = 2.0  # a rate is learned from this many accepted requests at least
    bound_within_s: float = 2.0  # a limit "holds work back" if it refused one this recently
    throttle_pause_s: float = 1.0  # pause after a limit 429 that named no Retry-After
    #: 429s are "persistent" (a limit, whatever the load) past this share of recent answers
    persistent_share: float = 0.1
    persistent_least: float = 3.0  # ... and at least this many of them
    persistent_tau_s: float = 10.0  # ... over about this long
    max_tenants: int = 4096  # tenants remembered for round-robin order


@dataclass
class _Counters:
    throttles: int = 0
    throttled_s: float = 0.0
    limit: int = 0
    noise: int = 0
    pauses: int = 0


@dataclass(frozen=True)
class _Limits:
    """A resource's limits in force in this pass, and the estimates they were read from."""

    estimates: dict[str, float]
    by_dimension: dict[str, Limit | None]

    def get(self, dimension: str) -> Limit | None:
        return self.by_dimension.get(dimension)


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

    def shut(self, plan: ResourcePlan | None) -> str | None:
        """The key that refuses every request of this resource for sure (its gate paused, its
        slots full), from what the pass learned; else None."""
        if self.recovering:
            return RECOVERING
        if plan is None:
            return None
        if plan.gate_key in self.closed:
            return plan.gate_key
        if plan.takes_slots and plan.slot_key in self.closed:
            return plan.slot_key
        return None

    def blocked(self, request: AcquireRequest) -> str | None:
        """The key that refuses this request for sure, from what the pass learned; else None."""
        if self.recovering:
            return RECOVERING
        for gate in request.gates:
            if gate in self.closed:
                return gate
        for claim in request.slots:
            if claim.key in self.closed:
                return claim.key
        for d in request.debits:
            key = d.bucket.key
            if key in self.reserved or d.cost >= self.floors.get(key, math.inf):
                return key
        return None

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
        self._limits = {name: self._read(plan, {}) for name, plan in self._plans.items()}
        self._counters = {name: _Counters() for name in self._plans}
        t = self._tuning
        self._persistence = {
            name: Persistence(t.persistent_tau_s, t.persistent_share, t.persistent_least)
            for name in self._plans
        }
        self._published: dict[str, dict[str, float]] = {name: {} for name in self._plans}
        #: resource -> dimension -> when it last refused a candidate in this process
        self._bound: dict[str, dict[str, float]] = {name: {} for name in self._plans}
        #: resource -> tenant -> reason -> how many its last pass held back
        self._held: dict[str, dict[str, dict[str, int]]] = {name: {} for name in self._plans}
        self._held_at: dict[str, float] = {}  # resource -> when its last pass held some back
        self._probed: dict[str, dict[str, float]] = {}  # resource -> dimension -> last grow
        #: resource -> whether the last in-flight refusal here came at or below the last cut
        self._below: dict[str, bool] = {}
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
        names = await self._refresh(unique)
        held: dict[str, dict[str, dict[str, int]]] = {name: {} for name in names}
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
                plan = self._plan(self._kinds.get(c.kind))
                shut = scan.shut(plan)
                if shut is not None:  # known before building the request: most of a queue
                    self._note_held(plan, c.tenant, held, (shut,), now)
                    continue
                attempt = self._attempt(c, plan)
                blocker = scan.blocked(attempt.request)
                if blocker is not None:
                    self._note_held(attempt.plan, c.tenant, held, (blocker,), now)
                    continue
                try:
                    result = await self._backend.acquire(attempt.request)
                except LimiterUnavailable:
                    if permits:  # what was granted is real: hand it over, fail on the next call
                        return permits
                    raise
                if result.granted:
                    holds = {**attempt.holds, GRANTED_AT: result.at, EPOCH: result.epoch}
                    if attempt.plan is not None and attempt.plan.takes_slots and result.in_use:
                        holds[IN_FLIGHT] = float(result.in_use[0])
                    name = attempt.plan.name if attempt.plan else None
                    permits.append(Permit(c.task_id, name, c.tenant, c.cost, holds))
                    rounds.admitted()
                    self._rotation.served(c.tenant)
                    continue
                self._note_held(attempt.plan, c.tenant, held, result.refused, now)
                aged = order.aged(c, now, self._tuning.aging_s)
                scan.refused(attempt.request, result, reserve=aged)
                if lane is Lane.INTERACTIVE:
                    scan.hold_for_background(attempt.request, result)
        self._held.update(held)
        self._held_at.update((name, now) for name, counts in held.items() if counts)
        if scan.wait is not None:
            self._retry_at = now + scan.wait
        return permits

    async def sending(self, permit: Permit) -> Permit:
        """Count the resource's calls in flight as this one goes out (adaptive resources): a
        call admitted early may be sent late, when many more are in flight, and a 429 to it
        is about those, not about the few there were at its admission. Best effort: without
        the backend, the count at admission stands."""
        plan = self._plan(permit.resource)
        if plan is None or not plan.adaptive or not permit.holds.get(SLOT):
            return permit
        claim = SlotClaim(plan.sent_key, UNCAPPED, permit.task_id, self._tuning.slot_ttl_s)
        try:
            result = await self._backend.acquire(AcquireRequest(slots=(claim,)))
        except LimiterUnavailable:
            return permit
        if not result.granted or not result.in_use:
            return permit
        counted = {IN_FLIGHT: float(result.in_use[0]), SENT_SLOT: 1.0, SENT_AT: result.at}
        return replace(permit, holds={**permit.holds, **counted})

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
                for dimension, bucket in self._buckets(plan).items():
                    taken = permit.holds.get(dimension, 0.0)
                    if taken:
                        await self._backend.settle(bucket, -taken)
            await self.release_slots(permit)
        except LimiterUnavailable as exc:
            log.warning("could not release the permit of %s: %s", permit.task_id, exc)

    def next_admission_in(self, now: float) -> float | None:
        return None if self._retry_at is None else max(0.0, self._retry_at - now)

    async def room(self, kinds: Sequence[str]) -> Room:
        """One slot count per resource. A kind without an in-flight cap always has room, and
        so does a resource limited only by buckets (their refill is timed, not signalled)."""
        now = self._clock.now()
        open_kinds: list[str] = []
        most: int | None = 0
        free: dict[str, int | None] = {}
        for kind in kinds:
            plan = self._plan(self._kinds.get(kind))
            if plan is None:
                open_kinds.append(kind)
                most = None
                continue
            if plan.name not in free:
                free[plan.name] = await self._free_slots(plan, now)
            slots = free[plan.name]
            if slots is None:
                most = None
            elif slots > 0:
                most = None if most is None else most + slots
            else:
                continue
            open_kinds.append(kind)
        if not open_kinds:
            self._retry_at = None  # only a release can help now: no timed wake-up
        return Room(tuple(open_kinds), most)

    async def _free_slots(self, plan: ResourcePlan, now: float) -> int | None:
        """The resource's free concurrency slots (None: no in-flight cap). A full one that
        held work back in its last pass still does: the in-flight limit is what binds it (a
        dispatcher that finds it full lists none of its work, and slow start must still grow
        on the answers that follow)."""
        cap = self._limits[plan.name].get(CONCURRENCY)
        if cap is None:
            return None
        free = int(cap.value) - await self._backend.slots_in_use(plan.slot_key)
        if free <= 0 and self._held[plan.name]:
            self._bound[plan.name][CONCURRENCY] = now
            self._held_at[plan.name] = now
        return max(0, free)

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
            if plan.takes_slots:
                holds[SLOT] = 1.0
            limits = self._limits[plan.name]
            if limits.get(REQUESTS) is not None:
                holds[REQUESTS] = 1.0
            if limits.get(TOKENS) is not None and cost > 0:
                holds[TOKENS] = cost
        if self._tenant_cap:
            holds[TENANT_SLOT] = 1.0
        return Permit(task_id, plan.name if plan else None, tenant, cost, holds)

    async def snapshot(self) -> dict[str, ResourceSnapshot]:
        out: dict[str, ResourceSnapshot] = {}
        now = self._clock.now()
        hint = self.next_admission_in(now)
        for name, plan in self._plans.items():
            limits = await self._reread(plan)
            buckets = self._buckets(plan)
            in_flight = await self._backend.slots_in_use(plan.slot_key) if plan.takes_slots else 0
            cap = limits.get(CONCURRENCY)
            requests = limits.get(REQUESTS)
            configured_rate = plan.configured(REQUESTS)
            counters = self._counters[name]
            sent = limits.estimates.get(SENT)
            fresh = self._held_at.get(name, -math.inf) >= now - HELD_FRESH_S
            held = {t: dict(n) for t, n in self._held[name].items()} if fresh else {}
            out[name] = ResourceSnapshot(
                concurrency=int(cap.value) if cap else 0,
                in_flight=in_flight,
                requests=await self._bucket_snapshot(buckets.get(REQUESTS)),
                tokens=await self._bucket_snapshot(buckets.get(TOKENS)),
                rate_factor=requests.value / configured_rate
                if requests and configured_rate
                else 1.0,
                paused_for=await self._backend.paused_for(plan.gate_key),
                throttled_s=counters.throttled_s,
                throttles=counters.throttles,
                next_admission_in=hint,
                limits=self._limit_snapshots(plan, limits),
                throttles_limit=counters.limit,
                throttles_noise=counters.noise,
                pauses=counters.pauses,
                sending_per_min=None if sent is None else sent / self._tuning.meter_tau_s * 60,
                held_back_by=_summed(held),
                held_back_by_tenant=held,
            )
        return out

    async def aclose(self) -> None:
        await self._backend.aclose()

    # -- internals: what is in force ----------------------------------------------------------
    def _plan(self, resource: str | None) -> ResourcePlan | None:
        # A resource named by a kind but not configured limits nothing.
        return None if resource is None else self._plans.get(resource)

    def _meter(self, plan: ResourcePlan) -> Meter | None:
        return Meter(plan.estimates_key, self._tuning.meter_tau_s) if plan.adaptive else None

    def _read(self, plan: ResourcePlan, estimates: dict[str, float]) -> _Limits:
        by_dimension = {
            d: in_force(
                d,
                plan.configured(d),
                estimates,
                adaptive=plan.adaptive,
                headroom=plan.config.headroom,
                initial_concurrency=self._tuning.initial_concurrency,
            )
            for d in DIMENSIONS
        }
        return _Limits(estimates, by_dimension)

    async def _reread(self, plan: ResourcePlan) -> _Limits:
        """The shared estimates of an adaptive resource, fresh (another process may have
        changed them); a resource that is not adaptive has only its configuration."""
        if plan.adaptive:
            estimates = await self._backend.estimates(plan.estimates_key, self._meter(plan))
            self._limits[plan.name] = self._read(plan, estimates)
        return self._limits[plan.name]

    async def _refresh(self, candidates: Sequence[Candidate]) -> set[str]:
        """Read each candidate resource's estimates once per pass; their names."""
        names = set()
        for c in candidates:
            plan = self._plan(self._kinds.get(c.kind))
            if plan is not None and plan.name not in names:
                names.add(plan.name)
                await self._reread(plan)
        return names

    def _buckets(self, plan: ResourcePlan) -> dict[str, Bucket]:
        limits = self._limits[plan.name]
        out = {}
        for dimension in RATES:
            limit = limits.get(dimension)
            if limit is not None:
                header = limit.source == HEADER or (
                    limit.source == LEARNED
                    and plan.configured(dimension) is None
                    and published(dimension) in limits.estimates
                )
                out[dimension] = plan.bucket(dimension, limit.value, published=header)
        return out

    def _attempt(self, c: Candidate, plan: ResourcePlan | None) -> _Attempt:
        ttl = self._tuning.claim_ttl_s
        holds: dict[str, float] = {}
        gates: tuple[str, ...] = ()
        slots: list[SlotClaim] = []
        debits: list[Debit] = []
        meter = None
        if plan is not None:
            limits = self._limits[plan.name]
            gates = (plan.gate_key,)
            if plan.takes_slots:
                cap = limits.get(CONCURRENCY)
                limit = int(cap.value) if cap else UNCAPPED
                # A resubmission inherits the slot its own orphaned call still holds.
                slots.append(
                    SlotClaim(plan.slot_key, limit, c.task_id, ttl, orphan_slot(c.task_id))
                )
                holds[SLOT] = 1.0
            buckets = self._buckets(plan)
            if REQUESTS in buckets:
                debits.append(Debit(buckets[REQUESTS], 1.0, self._tuning.send_lag_s))
                holds[REQUESTS] = 1.0
            if TOKENS in buckets and c.cost > 0:
                debits.append(Debit(buckets[TOKENS], c.cost, self._tuning.send_lag_s))
                holds[TOKENS] = c.cost
            meter = self._meter(plan)
        if self._tenant_cap:
            slots.append(SlotClaim(tenant_slot_key(c.tenant), self._tenant_cap, c.task_id, ttl))
            holds[TENANT_SLOT] = 1.0
        request = AcquireRequest(tuple(debits), tuple(slots), gates, meter)
        return _Attempt(plan, request, holds)

    def _slot_keys(self, permit: Permit, plan: ResourcePlan | None) -> list[str]:
        keys = []
        if plan is not None and permit.holds.get(SLOT):
            keys.append(plan.slot_key)
        if plan is not None and permit.holds.get(SENT_SLOT):
            keys.append(plan.sent_key)
        if permit.holds.get(TENANT_SLOT):
            keys.append(tenant_slot_key(permit.tenant))
        return keys

    def _note_held(
        self,
        plan: ResourcePlan | None,
        tenant: str,
        held: dict[str, dict[str, dict[str, int]]],
        refused: Sequence[str],
        now: float,
    ) -> None:
        """Count why a candidate of this resource was held back, and remember which of its
        limits hold work back (they are the ones worth probing upward)."""
        if plan is None:
            return
        reasons = {
            plan.gate_key: PAUSE,
            plan.slot_key: CONCURRENCY,
            f"r:{plan.name}:{REQUESTS}": REQUESTS,
            f"r:{plan.name}:{TOKENS}": TOKENS,
            RECOVERING: RECOVERING,
        }
        counts = held.setdefault(plan.name, {}).setdefault(tenant, {})
        for key in refused:
            reason = reasons.get(key, TENANT if key.startswith("t:") else key)
            counts[reason] = counts.get(reason, 0) + 1
            if reason in DIMENSIONS:
                self._bound[plan.name][reason] = now

    # -- internals: after the call ------------------------------------------------------------
    async def _settle(self, permit: Permit, settlement: Settlement, now: float) -> None:
        plan = self._plan(permit.resource)
        if plan is not None:
            tokens = self._buckets(plan).get(TOKENS)
            if tokens is not None and settlement.actual_cost is not None:
                delta = settlement.actual_cost - permit.holds.get(TOKENS, 0.0)
                if delta:
                    await self._backend.settle(tokens, delta)
            if not settlement.keep_slot:  # an answer (a parked job is still running)
                self._persistence[plan.name].record(now, throttled=settlement.throttled)
            # Pause before releasing the slot: nothing may slip into the freed slot first.
            if settlement.throttled:
                await self._throttled(plan, permit, settlement, now)
            if settlement.headers:
                await self._resync(plan, permit, settlement.headers, now)
        if settlement.keep_slot:
            ttl = self._tuning.upstream_slot_ttl_s
            if await self.renew([permit], ttl):
                # Not the task's own slot any more: held under its call's id (a process
                # started while the job ran holds it so), which is renewed by taking it again.
                await self.hold(permit, self._clock.now() + ttl)
        elif settlement.still_running_s is not None:
            await self.hold(permit, self._clock.now() + settlement.still_running_s)
        else:
            await self.release_slots(permit)
        if plan is not None and plan.adaptive and not settlement.throttled:
            await self._probe(plan, now)

    async def _throttled(
        self, plan: ResourcePlan, permit: Permit, settlement: Settlement, now: float
    ) -> None:
        """A 429: judge it, then pause and lower what it is about, or let it pass as noise."""
        counters = self._counters[plan.name]
        counters.throttles += 1
        verdict = judge(await self._facts(plan, permit, settlement, now))
        if not verdict.limit:
            counters.noise += 1
            log.info("resource %s: a 429 taken for noise (%s)", plan.name, verdict.why)
            return
        counters.limit += 1
        log.info("resource %s: a 429 taken for a limit (%s)", plan.name, verdict.why)
        if not verdict.concurrency_only:
            # A refusal for too many calls in flight needs no pause: the lowered in-flight cap
            # already holds new calls back until one ends, which is what frees the provider.
            pause = settlement.retry_after
            if pause is None:
                pause = self._tuning.throttle_pause_s
            if pause > 0:
                added = await self._backend.pause(plan.gate_key, pause)
                counters.throttled_s += added
                counters.pauses += added > 0
        if plan.adaptive:
            await self._lower(plan, permit, verdict)
        await self._reread(plan)
        buckets = self._buckets(plan)
        spent = [d for d in RATES if d in verdict.dimensions] or list(RATES)
        for dimension in spent:
            if dimension in buckets and not verdict.concurrency_only:
                await self._backend.clamp(buckets[dimension], 0.0)

    async def _facts(
        self, plan: ResourcePlan, permit: Permit, settlement: Settlement, now: float
    ) -> Throttle:
        limits = self._limits[plan.name]
        meter = self._meter(plan)
        rate = None
        if meter is not None:
            await self._backend.tick(meter, THROTTLED)
            limits = await self._reread(plan)
            rate = limits.estimates.get(SENT, 0.0) / meter.tau_s
        exhausted = frozenset(
            q.dimension
            for q in read_quotas(settlement.headers, now)
            if q.dimension in RATES
            and exhausted_pause(q, 1.0 if q.dimension == REQUESTS else permit.cost)
        )
        return Throttle(
            limits=limits.by_dimension,
            in_flight=permit.holds.get(IN_FLIGHT),
            sending_rate=rate,
            adaptive=plan.adaptive,
            concurrency_hint="concurren" in settlement.reason.lower(),
            exhausted=exhausted,
            persistent=self._persistence[plan.name].persistent(now),
        )

    async def _lower(self, plan: ResourcePlan, permit: Permit, verdict: Verdict) -> None:
        """Cut the estimate of each dimension the limit 429 is about (one cut per round trip:
        every request of the round was sent under the old estimate)."""
        limits = self._limits[plan.name]
        granted_at = permit.holds.get(GRANTED_AT, 0.0)
        t = self._tuning
        key = plan.estimates_key
        for dimension in verdict.dimensions:
            limit = limits.get(dimension)
            if dimension == CONCURRENCY:
                in_flight = permit.holds.get(IN_FLIGHT)
                if in_flight is not None:
                    to = self._in_flight_cut(limits.estimates, permit, in_flight)
                elif limit is not None:
                    to = limit.value * t.decrease
                else:
                    continue
                # Not once per round trip: the target is absolute, not a share of the estimate,
                # so every refusal of a round may lower it, and the one sent with the fewest
                # calls in flight says the most (the first one processed may be the last sent).
                await self._backend.cut(key, dimension, to, floor=1.0, granted_at=ANY_ROUND)
                continue
            achieved = self._achieved(limits) if dimension == REQUESTS else None
            current = math.inf if limit is None else limit.value
            if limit is None and (achieved is None or achieved * t.meter_tau_s < t.least_sample):
                continue  # too few answers to measure a rate: the pause alone, this time
            to = t.decrease * min(current, math.inf if achieved is None else achieved)
            if math.isfinite(current):  # a round of 429s accepts little: not a reason to crash
                to = max(to, t.deepest_cut * current)
            last_cut = limits.estimates.get(f"{dimension}:b")
            if achieved is not None and last_cut is not None and current > last_cut:
                # A probe above the last cut ended: the provider's burst hid its overshoot
                # until spent, and inflates the last second's rate (and half a doubled
                # estimate); the slow window's is what it sustained, and the last cut held.
                to = min(to, max(last_cut, t.decrease * self._achieved(limits, slow=True)))
            ceiling = None if limit is None else limit.ceiling
            floor = t.min_rate_per_s
            if ceiling is not None and math.isfinite(ceiling):
                floor = max(floor, t.floor * ceiling)
            await self._backend.cut(key, dimension, to, floor=floor, granted_at=granted_at)

    def _in_flight_cut(
        self, estimates: Mapping[str, float], permit: Permit, in_flight: float
    ) -> float:
        """The in-flight cap a refusal sent with ``in_flight`` calls out (itself included)
        calls for: the provider held ``in_flight - 1`` at most. A call sent after the last cut
        with no more calls out than that cut allowed says the limit came down, or that the cut
        came from a count above the cap; the second such refusal in a row says the limit came
        down, by how much one refusal does not tell: it cuts to a share of what was out, never
        below half of it."""
        t = self._tuning
        key = CONCURRENCY
        cut_at, base = estimates.get(f"{key}:c"), estimates.get(f"{key}:b")
        sent_at = permit.holds.get(SENT_AT)
        within = (
            cut_at is not None
            and base is not None
            and sent_at is not None
            and sent_at > cut_at
            and in_flight <= base
        )
        name = permit.resource or ""
        again = within and self._below.get(name, False)
        self._below[name] = within
        if again:
            return max(t.deepest_cut, t.in_flight_decrease) * in_flight
        return in_flight - 1

    def _achieved(self, limits: _Limits, *, slow: bool = False) -> float:
        """Requests per second the provider accepted lately (sent less refused), over the
        meter's short window or its slow one."""
        sent = limits.estimates.get(SENT_SLOW if slow else SENT, 0.0)
        refused = limits.estimates.get(THROTTLED_SLOW if slow else THROTTLED, 0.0)
        return max(0.0, sent - refused) / (self._tuning.meter_tau_s * (SLOW if slow else 1.0))

    async def _probe(self, plan: ResourcePlan, now: float) -> None:
        """No 429: raise each learned limit that held work back lately, one step (AIMD)."""
        limits = self._limits[plan.name]
        bound = self._bound[plan.name]
        t = self._tuning
        for dimension in DIMENSIONS:
            limit = limits.get(dimension)
            if limit is None or limit.source != LEARNED:
                continue
            if bound.get(dimension, -math.inf) < now - t.bound_within_s:
                continue
            if dimension == CONCURRENCY:
                # Slow start: one more per call answered, until the first cut; then probes.
                slow_start = not cuts(limits.estimates, dimension)
                step, interval = 1.0, 0.0 if slow_start else t.recovery_window_s
                start = limit.value
            else:
                known = math.isfinite(limit.ceiling)
                base = limits.estimates.get(f"{dimension}:b", limit.value)
                share = t.known_recovery_step if known else t.recovery_step
                step = share * (limit.ceiling if known else base)
                interval, start = t.recovery_window_s, limit.value
            tried = self._probed.setdefault(plan.name, {})
            if now - tried.get(dimension, -math.inf) < interval:
                continue  # the backend would refuse it too: spare the round trip
            tried[dimension] = now
            await self._backend.grow(
                plan.estimates_key,
                dimension,
                start=start,
                step=step,
                cap=limit.ceiling,
                interval_s=interval,
                quiet_s=t.probe_quiet_s,
            )

    async def _resync(
        self, plan: ResourcePlan, permit: Permit, headers: Mapping[str, str], now: float
    ) -> None:
        """Take in the provider's published figures: lower our buckets to what it says is
        left (never raise them), pause the resource when a dimension we do not meter is
        spent, and (adaptive) keep its published limits as the limits in force where nothing
        lower is configured."""
        buckets = self._buckets(plan)
        figures: dict[str, float] = {}
        for q in read_quotas(headers, now):
            rate = q.per_second
            if q.dimension == CONCURRENCY and q.limit is not None:
                figures[published(CONCURRENCY)] = min(
                    q.limit, figures.get(published(CONCURRENCY), math.inf)
                )
            elif rate is not None:
                figures[published(q.dimension)] = min(
                    rate, figures.get(published(q.dimension), math.inf)
                )
            if q.dimension == CONCURRENCY or q.remaining is None:
                continue
            bucket = buckets.get(q.dimension)
            if bucket is not None:
                if q.remaining < bucket.capacity:
                    await self._backend.clamp(bucket, q.remaining)
                continue
            need = 1.0 if q.dimension == REQUESTS else permit.cost
            pause = exhausted_pause(q, need)
            if pause:
                counters = self._counters[plan.name]
                added = await self._backend.pause(plan.gate_key, pause)
                counters.throttled_s += added
                counters.pauses += added > 0
        if plan.adaptive:
            await self._publish(plan, figures)

    async def _publish(self, plan: ResourcePlan, figures: dict[str, float]) -> None:
        """Write the published figures to the shared estimates when they changed (each
        response carries them; one write per change, not per response)."""
        known = self._published[plan.name]
        changed = {k: v for k, v in figures.items() if known.get(k) != v}
        if changed:
            await self._backend.note(plan.estimates_key, changed)
            known.update(changed)
            await self._reread(plan)

    def _limit_snapshots(self, plan: ResourcePlan, limits: _Limits) -> dict[str, LimitSnapshot]:
        out = {}
        for dimension in DIMENSIONS:
            limit = limits.get(dimension)
            if limit is None:
                continue
            scale = 1.0 if dimension == CONCURRENCY else 60.0  # rates per minute, as configured
            configured = plan.configured(dimension)
            figure = limits.estimates.get(published(dimension))
            learned = limits.estimates.get(dimension)
            slow_start = (
                dimension == CONCURRENCY
                and limit.source == LEARNED
                and not cuts(limits.estimates, dimension)
            )
            out[dimension] = LimitSnapshot(
                value=limit.value * scale,
                source=limit.source,
                configured=None if configured is None else configured * scale,
                published=None if figure is None else figure * scale,
                learned=limit.value * scale
                if slow_start and learned is None
                else (None if learned is None else learned * scale),
                slow_start=slow_start,
            )
        return out

    async def _bucket_snapshot(self, bucket: Bucket | None) -> BucketSnapshot | None:
        if bucket is None:
            return None
        level = await self._backend.level(bucket)
        return BucketSnapshot(bucket.capacity, level, bucket.refill_per_s)
