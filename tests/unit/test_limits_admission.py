"""LimitsAdmission over the local backend, on a fake clock: order, limits, settlement, AIMD."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floodway.config import ResourceConfig, TenantConfig
from floodway.core.errors import InvalidInput, LimiterUnavailable
from floodway.core.task import Candidate, Lane
from floodway.limits.admission import (
    EPOCH,
    GRANTED_AT,
    IN_FLIGHT,
    SLOT,
    AdmissionTuning,
    LimitsAdmission,
)
from floodway.limits.backend import AcquireRequest, AcquireResult, Bucket
from floodway.limits.base import Permit, Room, Settlement
from floodway.limits.headers import REQUESTS, TOKENS
from floodway.limits.local import LocalLimiterBackend
from floodway.limits.plan import CostTooLarge
from floodway.providers.sim.window import RequestBucket

T0 = 1_700_000_000.0


class FakeClock:
    """The shape of floodway.testing.FakeClock (now, async sleep, async advance), without its
    event-loop hops: these tests never sleep."""

    def __init__(self, start: float = T0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)

    async def advance(self, seconds: float) -> None:
        self.t += seconds


_seq = itertools.count(1)


def cand(
    task_id: str,
    *,
    cost: float = 0.0,
    tenant: str = "a",
    lane: Lane = Lane.BACKGROUND,
    created_at: float = T0,
    kind: str = "llm-call",
) -> Candidate:
    return Candidate(task_id, kind, tenant, lane, cost, next(_seq), created_at, None)


@dataclass
class Rig:
    adm: LimitsAdmission
    clock: FakeClock
    backend: LocalLimiterBackend

    @property
    def now(self) -> float:
        return self.clock.now()

    async def admit(self, *cands: Candidate) -> list[str]:
        return [p.task_id for p in await self.adm.admit(cands, self.now)]

    async def admit_permits(self, *cands: Candidate) -> list[Permit]:
        return await self.adm.admit(cands, self.now)

    async def settle(self, permit: Permit, **kw: object) -> None:
        await self.adm.settle(permit, Settlement(**kw), self.now)  # type: ignore[arg-type]


def rig(
    resource: ResourceConfig | None = None,
    *,
    tenants: TenantConfig | None = None,
    tuning: AdmissionTuning | None = None,
) -> Rig:
    clock = FakeClock()
    backend = LocalLimiterBackend(clock)
    resources = {"llm": resource} if resource is not None else {}
    adm = LimitsAdmission(
        resources,
        {"llm-call": "llm"},
        tenants or TenantConfig(),
        backend,
        clock,
        tuning,
    )
    return Rig(adm, clock, backend)


#: the buckets' own arithmetic, without the send lag (a full bucket's late refill: its own
#: tests below), for tests that count tokens exactly
EXACT = AdmissionTuning(send_lag_s=0.0)


def tpm(per_minute: float, burst: float, **kw: object) -> ResourceConfig:
    """A tokens/min resource whose bucket holds ``per_minute / 60 * burst``."""
    return ResourceConfig(tokens_per_minute=per_minute, burst=burst, **kw)


# -- order -----------------------------------------------------------------------------------
async def test_interactive_goes_first() -> None:
    r = rig(ResourceConfig(concurrency=1))
    old_background = cand("bg", created_at=T0 - 100)
    interactive = cand("ia", lane=Lane.INTERACTIVE)
    assert await r.admit(old_background, interactive) == ["ia"]


async def test_shortest_first_among_those_that_fit() -> None:
    r = rig(tpm(600, burst=50))  # 10 tokens/s, the bucket holds 500
    cands = [cand("t800", cost=800 - 400), cand("t100", cost=100), cand("t300", cost=300)]
    cands += [cand("t50", cost=50), cand("t450", cost=450)]
    # 50 + 100 + 300 = 450 fit; 400 and 450 no longer do, and do not hold anyone back.
    assert await r.admit(*cands) == ["t50", "t100", "t300"]


async def test_a_large_task_does_not_block_small_ones() -> None:
    r = rig(tpm(600, burst=50))
    await r.admit(cand("drain", cost=450))
    assert await r.admit(cand("big", cost=400), *(cand(f"s{i}", cost=10) for i in range(3))) == [
        "s0",
        "s1",
        "s2",
    ]


async def _stream_until_big_runs(r: Rig, horizon_s: float) -> float | None:
    """A 400-token task waits while a 100-token task arrives every 10 s: exactly the refill of
    a 10 tokens/s bucket, so without aging the large one never finds 400 tokens."""
    big = cand("big", cost=400, created_at=r.now)
    smalls = [cand(f"s{i}", cost=100, created_at=r.now) for i in range(5)]
    assert await r.admit(big, *smalls) == [s.task_id for s in smalls]
    waiting = []
    for second in range(1, int(horizon_s) + 1):
        await r.clock.advance(1.0)
        if second % 10 == 0:
            waiting.append(cand(f"late{second}", cost=100, created_at=r.now))
        admitted = await r.admit(big, *waiting)
        if "big" in admitted:
            return r.now - T0
        waiting = [c for c in waiting if c.task_id not in admitted]
    return None


async def test_aging_lets_the_large_task_through() -> None:
    r = rig(tpm(600, burst=50), tuning=AdmissionTuning(aging_s=30.0, send_lag_s=0.0))
    ran_at = await _stream_until_big_runs(r, horizon_s=300)
    # Aged at 30 s, then the bucket is held for it: 400 tokens at 10/s.
    assert ran_at is not None and 30 <= ran_at <= 30 + 40 + 1


async def test_without_aging_the_large_task_starves() -> None:
    r = rig(tpm(600, burst=50), tuning=AdmissionTuning(aging_s=0.0, send_lag_s=0.0))
    assert await _stream_until_big_runs(r, horizon_s=300) is None


async def test_tenants_take_turns() -> None:
    r = rig(ResourceConfig(concurrency=4))
    flood = [cand(f"a{i}", tenant="a", created_at=T0 - 60 + i) for i in range(500)]
    late = [cand(f"b{i}", tenant="b", created_at=T0) for i in range(10)]
    admitted = await r.admit(*flood, *late)
    assert admitted == ["a0", "b0", "a1", "b1"]


async def test_tenant_turns_carry_across_calls() -> None:
    r = rig(ResourceConfig(concurrency=1))
    cands = [cand(f"a{i}", tenant="a", created_at=T0 - 10) for i in range(5)]
    cands += [cand(f"b{i}", tenant="b") for i in range(2)]
    order = []
    for _ in range(5):
        permits = await r.admit_permits(*(c for c in cands if c.task_id not in order))
        assert len(permits) == 1
        order.append(permits[0].task_id)
        await r.settle(permits[0])
    assert order == ["a0", "b0", "a1", "b1", "a2"]


async def test_the_tenant_in_flight_cap() -> None:
    r = rig(ResourceConfig(concurrency=10), tenants=TenantConfig(concurrency=2))
    admitted = await r.admit(*(cand(f"a{i}", tenant="a") for i in range(5)), cand("b0", tenant="b"))
    assert sorted(admitted) == ["a0", "a1", "b0"]
    # Only a release helps a tenant at its cap.
    assert r.adm.next_admission_in(r.now) is None


async def test_a_tenant_cap_alone_limits_kinds_without_a_resource() -> None:
    r = rig(None, tenants=TenantConfig(concurrency=1))
    assert r.adm.limited
    assert await r.admit(cand("x1", kind="free"), cand("x2", kind="free")) == ["x1"]


# -- limits ----------------------------------------------------------------------------------
async def test_headroom_is_applied() -> None:
    r = rig(ResourceConfig(concurrency=10, requests_per_minute=60, headroom=0.5))
    plan = r.adm.plans["llm"]
    assert plan.concurrency == 5
    assert plan.requests is not None
    assert plan.requests.rate_per_s == pytest.approx(0.5)
    # burst = 60 (1 - 0.5) / 0.5 = 60 s of refill -> 30 requests: with 60 more in the next
    # minute at 0.5/s, a sliding minute never sees more than the published 60... here capped by
    # the five slots anyway.
    assert plan.requests.capacity == pytest.approx(30.0)
    assert len(await r.admit(*(cand(f"t{i}") for i in range(20)))) == 5


async def test_the_default_burst_keeps_a_sliding_minute_under_the_published_limit() -> None:
    r = rig(ResourceConfig(requests_per_minute=600, headroom=0.8))
    admitted = []
    for _ in range(120):  # two minutes, one second at a time
        admitted.append(len(await r.admit(*(cand(f"t{next(_seq)}") for _ in range(200)))))
        await r.clock.advance(1.0)
    # burst 15 s at 8/s = 120 at once, less the send lag's 0.25 s of refill (2); then 8 per
    # second. Any 60 s span: at most 600.
    assert admitted[0] == 118
    assert max(sum(admitted[i : i + 60]) for i in range(len(admitted) - 59)) <= 600


async def _provider_refusals(tuning: AdmissionTuning, first_delay_s: float) -> int:
    """Q2's load against a provider that enforces the same 600/min as an exact token bucket of
    a second's refill (the simulator's), configured at headroom 1.0: 300 calls, each reaching
    the provider a while after its admission (the first burst ``first_delay_s`` late, as a
    claim's write and new connections make it; the rest up to that, at random). How many of
    them the provider's bucket refuses on arrival."""
    r = rig(ResourceConfig(requests_per_minute=600, headroom=1.0), tuning=tuning)
    delays = random.Random(7)
    arrivals: list[float] = []
    queue = [cand(f"t{i}") for i in range(300)]
    while queue:
        admitted = set(await r.admit(*queue))
        delay = first_delay_s if not arrivals else delays.uniform(0.0, first_delay_s)
        arrivals += [r.now + delay] * len(admitted)
        queue = [c for c in queue if c.task_id not in admitted]
        wait = r.adm.next_admission_in(r.now)
        assert wait is not None or not queue
        # At least a millisecond, as the dispatcher's idle wait: a wait shorter than the
        # clock's resolution (a refill a rounding short of a token) would read as none.
        await r.clock.advance(max(0.001, wait or 0.0))
    provider = RequestBucket(rpm=600, capacity=10)
    refused = 0
    for at in sorted(arrivals):
        if provider.wait(at) > 0:
            refused += 1
        else:
            provider.take(at)
    return refused


async def test_an_exact_provider_bucket_never_refuses_a_call_sent_within_the_send_lag() -> None:
    # The provider's bucket, full until the first burst arrives, refills from then; a bucket
    # that refilled from the admission would send the next call a refill too early.
    assert await _provider_refusals(AdmissionTuning(send_lag_s=0.0), first_delay_s=0.03) > 0
    assert await _provider_refusals(AdmissionTuning(), first_delay_s=0.03) == 0
    assert await _provider_refusals(AdmissionTuning(), first_delay_s=0.2) == 0


async def test_requests_and_concurrency_both_hold() -> None:
    # 0.1/s, holds 1
    r = rig(ResourceConfig(concurrency=2, requests_per_minute=6, burst=10), tuning=EXACT)
    assert await r.admit(cand("a"), cand("b")) == ["a"]
    wait = r.adm.next_admission_in(r.now)
    assert wait == pytest.approx(10.0)
    await r.clock.advance(10.0)
    assert await r.admit(cand("b")) == ["b"]


async def test_next_admission_in_is_none_when_only_a_release_helps() -> None:
    r = rig(ResourceConfig(concurrency=1))
    (permit,) = await r.admit_permits(cand("a"))
    assert await r.admit(cand("b")) == []
    assert r.adm.next_admission_in(r.now) is None
    await r.settle(permit)
    assert await r.admit(cand("b")) == ["b"]


async def test_admit_stops_at_limit() -> None:
    r = rig(ResourceConfig(concurrency=10))
    permits = await r.adm.admit([cand(f"t{i}") for i in range(8)], r.now, limit=3)
    assert len(permits) == 3
    assert await r.backend.slots_in_use("r:llm:slots") == 3


async def test_a_task_admitted_elsewhere_is_not_admitted_twice() -> None:
    r = rig(ResourceConfig(concurrency=5))
    assert await r.admit(cand("same")) == ["same"]
    # Listed again before its claim landed: refused, and it does not close the slot set.
    assert await r.admit(cand("same"), cand("other")) == ["other"]


async def test_check_fits_refuses_an_impossible_cost() -> None:
    r = rig(tpm(600, burst=50))  # holds 500
    r.adm.check_fits("llm", 500)
    r.adm.check_fits(None, 10**9)
    r.adm.check_fits("not-configured", 10**9)
    with pytest.raises(CostTooLarge) as err:
        r.adm.check_fits("llm", 501)
    assert isinstance(err.value, InvalidInput)
    assert "'llm'" in str(err.value) and "500" in str(err.value) and "burst" in str(err.value)
    with pytest.raises(InvalidInput):
        r.adm.check_fits("llm", -1)


async def test_limited() -> None:
    assert not rig(ResourceConfig()).adm.limited
    assert rig(ResourceConfig(adaptive=True)).adm.limited
    assert rig(ResourceConfig(requests_per_minute=1)).adm.limited


# -- settlement ------------------------------------------------------------------------------
async def _tokens_level(r: Rig) -> float:
    snap = await r.adm.snapshot()
    assert snap["llm"].tokens is not None
    return snap["llm"].tokens.level


async def test_settle_refunds_and_debits_to_actual_usage() -> None:
    r = rig(tpm(600, burst=50), tuning=EXACT)  # holds 500, 10/s
    (permit,) = await r.admit_permits(cand("t", cost=400))
    assert permit.holds[TOKENS] == 400
    assert await _tokens_level(r) == pytest.approx(100)
    await r.settle(permit, actual_cost=150)  # used less: 250 back
    assert await _tokens_level(r) == pytest.approx(350)
    (permit2,) = await r.admit_permits(cand("u", cost=300))
    await r.settle(permit2, actual_cost=700)  # used more: 400 of debt
    assert await _tokens_level(r) == pytest.approx(-350)
    assert await r.admit(cand("v", cost=1)) == []
    assert r.adm.next_admission_in(r.now) == pytest.approx(35.1)


async def test_release_gives_everything_back() -> None:
    r = rig(
        ResourceConfig(concurrency=1, requests_per_minute=60, tokens_per_minute=600, burst=50),
        tuning=EXACT,
    )
    (permit,) = await r.admit_permits(cand("t", cost=200))
    assert set(permit.holds) == {SLOT, REQUESTS, TOKENS, GRANTED_AT, EPOCH, IN_FLIGHT}
    await r.adm.release(permit, r.now)
    snap = (await r.adm.snapshot())["llm"]
    assert snap.in_flight == 0
    assert snap.tokens is not None and snap.tokens.level == pytest.approx(500)
    assert snap.requests is not None and snap.requests.level == pytest.approx(50)


async def test_keep_slot_holds_the_slot_until_the_final_settle() -> None:
    r = rig(ResourceConfig(concurrency=1), tuning=AdmissionTuning(slot_ttl_s=30))
    (permit,) = await r.admit_permits(cand("upstream"))
    await r.settle(permit, keep_slot=True)
    await r.clock.advance(60)  # past the normal slot TTL: the upstream TTL applies
    assert await r.admit(cand("next")) == []
    rebuilt = r.adm.permit_for("upstream", "llm-call", "a", 0.0)  # e.g. in the webhook process
    await r.settle(rebuilt)
    assert await r.admit(cand("next")) == ["next"]


async def test_a_crashed_holder_s_slot_expires() -> None:
    r = rig(ResourceConfig(concurrency=1), tuning=AdmissionTuning(slot_ttl_s=30))
    (permit,) = await r.admit_permits(cand("crashed"))
    assert await r.adm.renew([permit]) == []  # claimed: the slot now lasts slot_ttl_s
    await r.clock.advance(20)
    await r.adm.renew([permit])
    await r.clock.advance(20)
    assert await r.admit(cand("next")) == []  # renewed: still held at 40 s
    await r.clock.advance(11)
    assert await r.admit(cand("next")) == ["next"]


async def test_a_limit_429_pauses_the_whole_resource_until_its_retry_after() -> None:
    r = rig(ResourceConfig(adaptive=True))  # nothing known: the first 429 is a limit
    (permit,) = await r.admit_permits(cand("hit"))
    await r.settle(permit, throttled=True, retry_after=5.0)
    assert await r.admit(cand("x"), cand("y", lane=Lane.INTERACTIVE)) == []
    assert r.adm.next_admission_in(r.now) == pytest.approx(5.0)
    await r.clock.advance(4.9)
    assert await r.admit(cand("x")) == []
    await r.clock.advance(0.1)
    assert await r.admit(cand("x")) == ["x"]
    snap = (await r.adm.snapshot())["llm"]
    assert snap.throttles == snap.throttles_limit == snap.pauses == 1
    assert snap.throttled_s == pytest.approx(5.0)
    assert snap.held_back_by == {}  # the last pass admitted x and held nothing back


async def test_a_noise_429_neither_pauses_nor_lowers_a_configured_limit() -> None:
    r = rig(
        ResourceConfig(concurrency=2, requests_per_minute=60, burst=10, adaptive=True),
        tuning=EXACT,
    )
    first, _ = await r.admit_permits(cand("hit"), cand("busy"))
    await r.settle(first, throttled=True, retry_after=5.0)
    assert await r.admit(cand("x")) == ["x"]  # the freed slot, at once
    snap = (await r.adm.snapshot())["llm"]
    assert snap.throttles_noise == 1 and snap.throttles_limit == 0 and snap.pauses == 0
    cap = snap.limits["concurrency"]
    assert cap.value == 2 and cap.source == "configured"
    assert snap.requests is not None and snap.requests.level == pytest.approx(7.0)


async def test_a_limit_429_empties_the_buckets() -> None:
    r = rig(ResourceConfig(requests_per_minute=60, burst=10))  # 1/s, holds 10
    (permit,) = await r.admit_permits(cand("hit"))
    spent = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "0s"}
    await r.settle(permit, throttled=True, retry_after=0.0, headers=spent)
    assert await r.admit(cand("x")) == []
    assert r.adm.next_admission_in(r.now) == pytest.approx(1.0)


async def test_rate_discovery_starts_from_what_was_achieved_and_probes_up() -> None:
    tuning = AdmissionTuning(throttle_pause_s=0.0, recovery_step=0.05, initial_concurrency=50)
    r = rig(ResourceConfig(adaptive=True), tuning=tuning)
    for i in range(20):  # 20 requests a second for a second, accepted
        (p,) = await r.admit_permits(cand(f"ok{i}"))
        await r.settle(p)
        await r.clock.advance(0.05)
    round1 = await r.admit_permits(cand("a"), cand("b"))
    for p in round1:  # both 429: one cut, not two
        await r.settle(p, throttled=True)
    rate = (await r.adm.snapshot())["llm"].limits["requests"]
    assert rate.source == "learned"
    # 0.9 x the ~20/s accepted over the meter's second (decayed): well under what was sent.
    assert 600 < rate.value < 20 * 60 * 0.9
    learned = rate.value
    # Probed up only while it holds work back: idle, it stays.
    await r.clock.advance(10)
    (p,) = await r.admit_permits(cand("idle"))
    await r.settle(p)
    assert (await r.adm.snapshot())["llm"].limits["requests"].value == pytest.approx(learned)
    values = []
    for i in range(6):
        await r.clock.advance(1.0)
        permits = await r.admit_permits(*(cand(f"busy{i}-{j}") for j in range(200)))
        for p in permits:
            await r.settle(p)
        values.append((await r.adm.snapshot())["llm"].limits["requests"].value)
    steps = [b - a for a, b in zip([learned, *values], values, strict=False)]
    # Each step of the probe doubles the first (a share of the rate it was cut to).
    assert steps == pytest.approx([0.05 * learned * 2**i for i in range(6)])


async def test_concurrency_slow_start_doubles_per_round_trip() -> None:
    r = rig(ResourceConfig(adaptive=True), tuning=AdmissionTuning(initial_concurrency=2))
    ready = {f"t{i}": cand(f"t{i}") for i in range(40)}
    widths = []
    for _ in range(4):
        permits = await r.admit_permits(*ready.values())
        widths.append(len(permits))
        snap = (await r.adm.snapshot())["llm"]
        assert snap.limits["concurrency"].slow_start
        assert snap.held_back_by == {"concurrency": len(ready) - len(permits)}
        for p in permits:
            del ready[p.task_id]
            await r.settle(p)  # each answer while the cap held work back: one more slot
    assert widths == [2, 4, 8, 16]


async def test_a_concurrency_refusal_sets_the_cap_below_the_calls_in_flight() -> None:
    tuning = AdmissionTuning(initial_concurrency=12)
    r = rig(ResourceConfig(adaptive=True), tuning=tuning)
    permits = await r.admit_permits(*(cand(f"t{i}") for i in range(12)))
    assert len(permits) == 12
    refused = permits[-1]  # the 12th in flight: the provider holds 11 at most
    await r.settle(refused, throttled=True, retry_after=1.0, reason="too many concurrent requests")
    snap = (await r.adm.snapshot())["llm"]
    assert snap.limits["concurrency"].value == 11 and not snap.limits["concurrency"].slow_start
    assert snap.pauses == 0  # the cap holds new calls back; a pause would only idle the rest
    assert await r.admit(cand("more")) == []
    await r.settle(permits[0])
    assert await r.admit(cand("more")) == ["more"]


async def test_a_refusal_counts_the_calls_out_when_it_was_sent_not_admitted() -> None:
    r = rig(ResourceConfig(adaptive=True), tuning=AdmissionTuning(initial_concurrency=12))
    early, *rest = await r.admit_permits(*(cand(f"t{i}") for i in range(12)))
    assert early.holds[IN_FLIGHT] == 1  # admitted first
    for p in rest:
        await r.adm.sending(p)
    late = await r.adm.sending(early)  # ... sent last, with 11 others out
    assert late.holds[IN_FLIGHT] == 12
    await r.settle(late, throttled=True, retry_after=1.0, reason="too many concurrent requests")
    assert (await r.adm.snapshot())["llm"].limits["concurrency"].value == 11


async def test_refusals_at_what_the_last_cut_allowed_cut_deeper() -> None:
    """A cap that came down: the second refusal at or below the last cut cuts to a share of
    the calls out (0.7), never below half; a refusal above it (a probe) only to below it."""
    r = rig(ResourceConfig(adaptive=True), tuning=AdmissionTuning(initial_concurrency=11))
    refused = "too many concurrent requests"
    permits = [
        await r.adm.sending(p) for p in await r.admit_permits(*(cand(f"a{i}") for i in range(11)))
    ]
    await r.settle(permits.pop(), throttled=True, retry_after=1.0, reason=refused)
    assert (await r.adm.snapshot())["llm"].limits["concurrency"].value == 10
    await r.clock.advance(0.1)
    for expected in (9.0, 0.7 * 9):  # the provider's cap fell under 10
        await r.clock.advance(0.1)
        await r.settle(permits.pop(), reason="")  # one ends, and the next sent is refused
        (p,) = await r.admit_permits(cand(f"b{expected}"))
        p = await r.adm.sending(p)
        await r.clock.advance(0.1)
        await r.settle(p, throttled=True, retry_after=1.0, reason=refused)
        cap = (await r.adm.snapshot())["llm"].limits["concurrency"].value
        assert cap == pytest.approx(expected)


async def test_non_adaptive_resources_keep_their_rate() -> None:
    r = rig(ResourceConfig(requests_per_minute=600), tuning=AdmissionTuning(throttle_pause_s=0))
    (p,) = await r.admit_permits(cand("a"))
    await r.settle(p, throttled=True)
    assert (await r.adm.snapshot())["llm"].rate_factor == 1.0


async def test_rate_limit_headers_lower_the_buckets() -> None:
    r = rig(
        ResourceConfig(requests_per_minute=600, tokens_per_minute=60_000, burst=10), tuning=EXACT
    )
    (p,) = await r.admit_permits(cand("a", cost=100))
    headers = {
        "X-RateLimit-Remaining-Requests": "3",
        "x-ratelimit-reset-requests": "6s",
        "x-ratelimit-remaining-tokens": "999999",  # more than we believe: ignored
    }
    await r.settle(p, actual_cost=100, headers=headers)
    snap = (await r.adm.snapshot())["llm"]
    assert snap.requests is not None and snap.requests.level == pytest.approx(3)
    assert snap.tokens is not None and snap.tokens.level == pytest.approx(9_900)
    assert len(await r.admit(*(cand(f"t{i}") for i in range(10)))) == 3


async def test_an_unmetered_dimension_reported_exhausted_pauses_the_resource() -> None:
    r = rig(ResourceConfig(adaptive=True))  # no figures configured: learn from the provider
    (p,) = await r.admit_permits(cand("a"))
    headers = {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "30s",
    }
    await r.settle(p, headers=headers)
    assert await r.admit(cand("b")) == []
    assert r.adm.next_admission_in(r.now) == pytest.approx(30 / 600)  # one request's share
    await r.clock.advance(0.05)
    assert await r.admit(cand("b")) == ["b"]


async def test_a_slot_whose_claim_never_came_expires_after_the_claim_ttl() -> None:
    """The admitting process died before its claim: the task is admissible again soon."""
    tuning = AdmissionTuning(slot_ttl_s=120, claim_ttl_s=5)
    r = rig(ResourceConfig(concurrency=1), tuning=tuning)
    assert await r.admit(cand("orphaned")) == ["orphaned"]
    await r.clock.advance(4.9)
    assert await r.admit(cand("orphaned"), cand("next")) == []
    await r.clock.advance(0.2)
    assert await r.admit(cand("orphaned"), cand("next")) == ["orphaned"]


async def test_a_cost_no_bucket_can_hold_reserves_nothing() -> None:
    r = rig(tpm(600, burst=50))  # holds 500; check_fits would have refused 900 at submit
    impossible = cand("huge", cost=900, lane=Lane.INTERACTIVE, created_at=T0 - 3600)
    assert await r.admit(impossible, cand("small", cost=10)) == ["small"]


async def test_renew_reports_lost_slots_and_release_slots_frees_only_slots() -> None:
    r = rig(ResourceConfig(concurrency=2, tokens_per_minute=600, burst=50))
    tuning_ttl = AdmissionTuning().slot_ttl_s
    a, b = await r.admit_permits(cand("a", cost=100), cand("b", cost=100))
    assert await r.adm.renew([a, b]) == []  # both claimed
    await r.clock.advance(tuning_ttl / 2)
    assert await r.adm.renew([a]) == []
    await r.clock.advance(tuning_ttl / 2 + 1)
    assert await r.adm.renew([a, b]) == ["b"]  # b was never renewed: it expired
    await r.adm.release_slots(a)
    snap = (await r.adm.snapshot())["llm"]
    assert snap.in_flight == 0
    assert snap.tokens is not None and snap.tokens.level == pytest.approx(500)  # refilled


# -- failing closed --------------------------------------------------------------------------
class FlakyBackend(LocalLimiterBackend):
    """Fails every acquire after the first ``ok`` ones."""

    def __init__(self, clock: FakeClock, ok: int) -> None:
        super().__init__(clock)
        self.ok = ok

    async def acquire(self, request: AcquireRequest) -> AcquireResult:
        if self.ok <= 0:
            raise LimiterUnavailable("down")
        self.ok -= 1
        return await super().acquire(request)


async def test_an_unreachable_backend_admits_nothing() -> None:
    clock = FakeClock()
    adm = LimitsAdmission(
        {"llm": ResourceConfig(concurrency=5)},
        {"llm-call": "llm"},
        TenantConfig(),
        FlakyBackend(clock, ok=0),
        clock,
    )
    with pytest.raises(LimiterUnavailable):
        await adm.admit([cand("a")], clock.now())


class DownBackend(LocalLimiterBackend):
    async def release_slot(self, key: str, slot_id: str) -> bool:
        raise LimiterUnavailable("down")

    async def settle(self, bucket: Bucket, delta: float) -> float:
        raise LimiterUnavailable("down")


async def test_settle_and_release_are_best_effort() -> None:
    clock = FakeClock()
    adm = LimitsAdmission(
        {"llm": ResourceConfig(concurrency=5, tokens_per_minute=600)},
        {"llm-call": "llm"},
        TenantConfig(),
        DownBackend(clock),
        clock,
    )
    (p,) = await adm.admit([cand("a", cost=5)], clock.now())
    await adm.settle(p, Settlement(actual_cost=1), clock.now())  # logs, does not raise
    await adm.release(p, clock.now())


async def test_what_was_granted_before_the_backend_failed_is_handed_over() -> None:
    clock = FakeClock()
    adm = LimitsAdmission(
        {"llm": ResourceConfig(concurrency=5)},
        {"llm-call": "llm"},
        TenantConfig(),
        FlakyBackend(clock, ok=2),
        clock,
    )
    permits = await adm.admit([cand(f"t{i}") for i in range(4)], clock.now())
    assert len(permits) == 2


# -- the property ----------------------------------------------------------------------------
@dataclass
class Ledger:
    """Our own account of what reached the provider, to check the limits from outside."""

    #: bucket -> [(time, amount, task id)]: debits at admission, usage corrections at settle
    events: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)
    in_flight: dict[str, Permit] = field(default_factory=dict)

    def add(self, bucket: str, at: float, amount: float, task_id: str) -> None:
        self.events.setdefault(bucket, []).append((at, amount, task_id))

    def forget(self, task_id: str) -> None:
        """A released permit's task never reached the provider: as if it was never admitted."""
        for bucket, events in self.events.items():
            self.events[bucket] = [e for e in events if e[2] != task_id]

    def check_bucket(self, bucket: str, capacity: float, rate: float) -> None:
        """Token-bucket bound: what was taken between any earlier event and the latest debit
        is at most capacity + rate x elapsed."""
        events = self.events.get(bucket, [])
        if not events or events[-1][1] <= 0:
            return
        end, total = events[-1][0], 0.0
        for at, amount, _ in reversed(events):
            total += amount
            assert total <= capacity + rate * (end - at) + 1e-6, (bucket, total, end - at)


_op = st.one_of(
    st.tuples(
        st.just("submit"),
        st.sampled_from(["a", "b", "c"]),
        st.floats(0, 300),
        st.sampled_from(list(Lane)),
        st.integers(1, 8),  # how many such tasks
    ),
    st.tuples(st.just("admit")),
    st.tuples(
        st.just("settle"),
        st.integers(0, 50),
        st.one_of(st.none(), st.floats(0, 600)),
        st.booleans(),
    ),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.floats(0, 20)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    concurrency=st.integers(0, 4),
    rpm=st.sampled_from([0, 3, 6, 30, 120]),
    tpm_=st.sampled_from([0, 600, 3000]),
    headroom=st.sampled_from([0.5, 0.8, 1.0]),
    adaptive=st.booleans(),
    tenant_cap=st.integers(0, 2),
    ops=st.lists(_op, min_size=5, max_size=60),
)
def test_no_sequence_of_admits_and_settles_exceeds_a_limit(
    concurrency: int,
    rpm: int,
    tpm_: int,
    headroom: float,
    adaptive: bool,
    tenant_cap: int,
    ops: Sequence[tuple[object, ...]],
) -> None:
    config = ResourceConfig(
        concurrency=concurrency,
        requests_per_minute=rpm,
        tokens_per_minute=tpm_,
        headroom=headroom,
        adaptive=adaptive,
    )
    r = rig(config, tenants=TenantConfig(concurrency=tenant_cap))
    asyncio.run(_run_ops(r, ops))


async def _run_ops(r: Rig, ops: Sequence[tuple[object, ...]]) -> None:
    plan = r.adm.plans["llm"]
    ledger = Ledger()
    queued: dict[str, Candidate] = {}
    ids = itertools.count()
    for op in ops:
        if op[0] == "submit":
            _, tenant, cost, lane, count = op
            assert isinstance(cost, float) and isinstance(tenant, str) and isinstance(lane, Lane)
            assert isinstance(count, int)
            try:
                r.adm.check_fits("llm", cost)
            except CostTooLarge:
                continue
            for _ in range(count):
                c = cand(f"t{next(ids)}", cost=cost, tenant=tenant, lane=lane, created_at=r.now)
                queued[c.task_id] = c
        elif op[0] == "admit":
            admitted = await r.adm.admit(list(queued.values()), r.now)
            await r.adm.renew(admitted)  # the claims landed (as the worker confirms them)
            for p in admitted:
                del queued[p.task_id]
                ledger.in_flight[p.task_id] = p
                debited = [hold for hold in (REQUESTS, TOKENS) if hold in p.holds]
                for hold in debited:
                    ledger.add(hold, r.now, p.holds[hold], p.task_id)
                # A bucket's bound holds at each of its debits (usage beyond an estimate,
                # settled later, is debt the next debit must wait out).
                _check(ledger, r, {k: v for k, v in plan_buckets(plan).items() if k in debited})
        elif op[0] in ("settle", "release"):
            if not ledger.in_flight:
                continue
            index = op[1]
            assert isinstance(index, int)
            p = list(ledger.in_flight.values())[index % len(ledger.in_flight)]
            del ledger.in_flight[p.task_id]
            if op[0] == "release":
                await r.adm.release(p, r.now)
                ledger.forget(p.task_id)
            else:
                actual, throttled = op[2], op[3]
                assert actual is None or isinstance(actual, float)
                await r.settle(p, actual_cost=actual, throttled=throttled, retry_after=1.0)
                if actual is not None and plan.tokens is not None:
                    ledger.add(TOKENS, r.now, actual - p.holds.get(TOKENS, 0.0), p.task_id)
        else:
            dt = op[1]
            assert isinstance(dt, float)
            await r.clock.advance(dt)
        _check_slots(ledger, plan.concurrency, r.adm)


def plan_buckets(plan: object) -> Mapping[str, tuple[float, float]]:
    from floodway.limits.plan import ResourcePlan

    assert isinstance(plan, ResourcePlan)
    return {b.dimension: (b.capacity, b.rate_per_s) for b in plan.buckets()}


def _check(ledger: Ledger, r: Rig, buckets: Mapping[str, tuple[float, float]]) -> None:
    for dimension, (capacity, rate) in buckets.items():
        ledger.check_bucket(dimension, capacity, rate)


def _check_slots(ledger: Ledger, concurrency: int, adm: LimitsAdmission) -> None:
    if concurrency:
        assert len(ledger.in_flight) <= concurrency
    cap = adm._tenant_cap
    if cap:
        per_tenant: dict[str, int] = {}
        for p in ledger.in_flight.values():
            per_tenant[p.tenant] = per_tenant.get(p.tenant, 0) + 1
        assert all(n <= cap for n in per_tenant.values()), per_tenant


async def test_room_names_the_kinds_whose_resource_has_a_free_slot_and_how_many() -> None:
    r = rig(ResourceConfig(concurrency=2))
    assert await r.adm.room(["llm-call"]) == Room(("llm-call",), 2)
    (a,) = await r.admit_permits(cand("a"))
    assert await r.adm.room(["llm-call"]) == Room(("llm-call",), 1)
    await r.admit_permits(cand("b"))
    assert await r.adm.room(["llm-call"]) == Room((), 0)
    assert r.adm.next_admission_in(r.now) is None  # only a release helps
    # A kind with no resource (or an unknown one) can always be admitted, without a bound.
    assert await r.adm.room(["llm-call", "plain"]) == Room(("plain",), None)
    await r.adm.release_slots(a)
    assert await r.adm.room(["llm-call"]) == Room(("llm-call",), 1)


async def test_a_resource_limited_by_buckets_alone_always_has_room() -> None:
    r = rig(tpm(600, burst=1))
    await r.admit(cand("drain", cost=10))
    assert await r.adm.room(["llm-call"]) == Room(("llm-call",), None)


async def test_a_full_resource_found_by_its_slot_count_is_bound_by_the_in_flight_limit() -> None:
    """A dispatcher looks at the slot counts before listing, and lists no work of a full
    resource: slow start must still grow on the answers that follow (in a fleet, that look is
    all most passes do)."""
    r = rig(ResourceConfig(adaptive=True), tuning=AdmissionTuning(initial_concurrency=2))
    first = await r.admit_permits(cand("a"), cand("b"), cand("c"))
    await r.adm.renew(first)  # claimed: the slots outlive the claim TTL
    await r.clock.advance(10)  # the refusal noted by that pass is long past
    assert await r.adm.room(["llm-call"]) == Room((), 0)
    for p in first:
        await r.settle(p)
    assert (await r.adm.snapshot())["llm"].limits["concurrency"].value == 4
