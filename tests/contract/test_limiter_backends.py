"""One conformance suite for every limiter backend: the in-process one and Redis (Lua).

The local backend runs on a fake clock that the test advances. The Redis backend keeps time
with the server's TIME, so its tests wait for real, with rates and TTLs small enough that a wait
is a few hundred milliseconds, and polls (bounded) rather than sleeping a fixed guess.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from floodway.config import ResourceConfig, TenantConfig
from floodway.core.errors import LimiterUnavailable
from floodway.core.task import Candidate, Lane
from floodway.limits.admission import AdmissionTuning, LimitsAdmission
from floodway.limits.backend import (
    RECOVERING,
    SENT,
    SENT_SLOW,
    SLOW,
    THROTTLED,
    THROTTLED_SLOW,
    AcquireRequest,
    Bucket,
    Debit,
    LimiterBackend,
    Meter,
    SlotClaim,
)
from floodway.limits.base import Settlement
from floodway.limits.local import LocalLimiterBackend
from floodway.limits.redis_backend import RedisLimiterBackend
from floodway.testing import FakeClock

REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass
class Harness:
    backend: LimiterBackend
    #: let at least ``seconds`` pass on the backend's clock
    advance: Callable[[float], Awaitable[None]]
    real_time: bool


@pytest.fixture(params=["local", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "local":
        clock = FakeClock()

        async def advance_fake(seconds: float) -> None:
            await clock.advance(seconds)

        yield Harness(LocalLimiterBackend(clock), advance_fake, real_time=False)
        return
    prefix = f"test-{uuid.uuid4().hex}"
    backend = RedisLimiterBackend.from_url(REDIS_URL, prefix)
    client = backend.client
    try:
        await client.ping()
    except (OSError, aioredis.RedisError):
        await backend.aclose()
        pytest.skip("no Redis at 127.0.0.1:6379")

    async def advance_real(seconds: float) -> None:
        await asyncio.sleep(seconds)

    try:
        yield Harness(backend, advance_real, real_time=True)
    finally:
        keys = [k async for k in client.scan_iter(match=f"floodway:{{{prefix}}}:*")]
        if keys:
            await client.delete(*keys)
        await backend.aclose()


async def eventually(check: Callable[[], Awaitable[bool]], h: Harness, step: float) -> None:
    """Advance ``step`` at a time until ``check`` holds (bounded: 40 steps)."""
    for _ in range(40):
        if await check():
            return
        await h.advance(step)
    raise AssertionError("condition never held")


def bucket(key: str = "b", capacity: float = 5.0, rate: float = 10.0) -> Bucket:
    return Bucket(key, capacity, rate)


def take(b: Bucket, cost: float = 1.0) -> AcquireRequest:
    return AcquireRequest(debits=(Debit(b, cost),))


def slot(key: str, slot_id: str, limit: int = 1, ttl_s: float = 30.0) -> SlotClaim:
    return SlotClaim(key, limit, slot_id, ttl_s)


# -- buckets ---------------------------------------------------------------------------------
async def test_a_new_bucket_starts_full_and_refuses_past_capacity(harness: Harness) -> None:
    b = bucket(capacity=3, rate=0.01)
    results = [await harness.backend.acquire(take(b)) for _ in range(4)]
    assert [r.granted for r in results] == [True, True, True, False]
    refused = results[-1]
    assert refused.refused == ("b",)
    assert refused.retry_in == pytest.approx(100.0, rel=0.05)  # 1 token at 0.01/s
    assert await harness.backend.level(b) == pytest.approx(0.0, abs=0.01)


async def test_a_bucket_refills_over_time_up_to_capacity(harness: Harness) -> None:
    b = bucket(capacity=2, rate=10.0)
    assert (await harness.backend.acquire(take(b, 2))).granted
    refused = await harness.backend.acquire(take(b, 2))
    assert not refused.granted and refused.retry_in is not None
    assert 0.0 < refused.retry_in <= 0.2
    await harness.advance(refused.retry_in + 0.02)
    assert (await harness.backend.acquire(take(b, 2))).granted
    await harness.advance(1.0)  # ten tokens' worth of time, but it holds only two
    assert await harness.backend.level(b) == pytest.approx(2.0)


async def test_a_take_with_a_lag_starts_a_full_buckets_refill_that_late(harness: Harness) -> None:
    b = bucket(capacity=4, rate=0.01)  # slow: the real clock's drift reads as nothing
    lagged = AcquireRequest(debits=(Debit(b, 1.0, lag_s=50.0),))  # 0.5 token of refill
    assert (await harness.backend.acquire(lagged)).granted
    assert await harness.backend.level(b) == pytest.approx(2.5, abs=0.01)
    # A bucket that has been drawing on lies below capacity - lag: the lag takes nothing more.
    assert (await harness.backend.acquire(lagged)).granted
    assert await harness.backend.level(b) == pytest.approx(1.5, abs=0.01)


async def test_a_cost_above_capacity_never_fits(harness: Harness) -> None:
    result = await harness.backend.acquire(take(bucket(capacity=3), 4))
    assert not result.granted and result.retry_in is None


async def test_settle_refunds_up_to_capacity_and_debits_into_debt(harness: Harness) -> None:
    be = harness.backend
    b = bucket(capacity=10, rate=0.001)
    assert (await be.acquire(take(b, 8))).granted
    assert await be.settle(b, -5) == pytest.approx(7.0, abs=0.01)
    assert await be.settle(b, -50) == pytest.approx(10.0)  # never above capacity
    assert await be.settle(b, 25) == pytest.approx(-15.0, abs=0.01)  # debt
    result = await be.acquire(take(b, 1))
    assert not result.granted
    assert result.retry_in == pytest.approx(16 / 0.001, rel=0.01)  # repay the debt, then 1


async def test_clamp_only_lowers(harness: Harness) -> None:
    be = harness.backend
    b = bucket(capacity=10, rate=0.001)
    assert await be.clamp(b, 20) == pytest.approx(10.0)
    assert await be.clamp(b, 4) == pytest.approx(4.0, abs=0.01)
    assert await be.clamp(b, 8) == pytest.approx(4.0, abs=0.01)
    assert not (await be.acquire(take(b, 5))).granted


# -- slots -----------------------------------------------------------------------------------
async def test_slots_up_to_the_limit_then_a_release_frees_one(harness: Harness) -> None:
    be = harness.backend
    assert (await be.acquire(AcquireRequest(slots=(slot("s", "a", 2),)))).granted
    assert (await be.acquire(AcquireRequest(slots=(slot("s", "b", 2),)))).granted
    full = await be.acquire(AcquireRequest(slots=(slot("s", "c", 2),)))
    assert not full.granted and full.refused == ("s",) and full.retry_in is None
    assert full.held == ()
    assert await be.slots_in_use("s") == 2
    assert await be.release_slot("s", "a")
    assert not await be.release_slot("s", "a")  # twice is a no-op
    assert (await be.acquire(AcquireRequest(slots=(slot("s", "c", 2),)))).granted


async def test_a_slot_id_cannot_hold_two_slots(harness: Harness) -> None:
    be = harness.backend
    assert (await be.acquire(AcquireRequest(slots=(slot("s", "a", 5),)))).granted
    again = await be.acquire(AcquireRequest(slots=(slot("s", "a", 5),)))
    assert not again.granted and again.held == ("s",)
    assert await be.slots_in_use("s") == 1


async def test_an_expired_slot_comes_back(harness: Harness) -> None:
    """A crashed holder never releases: its slot must expire."""
    be = harness.backend
    assert (await be.acquire(AcquireRequest(slots=(slot("s", "dead", 1, ttl_s=0.2),)))).granted
    assert not (await be.acquire(AcquireRequest(slots=(slot("s", "next", 1),)))).granted

    async def freed() -> bool:
        return (await be.acquire(AcquireRequest(slots=(slot("s", "next", 1),)))).granted

    await eventually(freed, harness, 0.05)
    assert await be.slots_in_use("s") == 1


async def test_renew_keeps_a_slot_past_its_first_ttl(harness: Harness) -> None:
    be = harness.backend
    assert (await be.acquire(AcquireRequest(slots=(slot("s", "a", 1, ttl_s=0.3),)))).granted
    await harness.advance(0.1)
    assert await be.renew_slot("s", "a", 5.0)
    await harness.advance(0.4)  # past the first TTL
    assert await be.slots_in_use("s") == 1
    assert not await be.renew_slot("s", "ghost", 5.0)


# -- all or nothing --------------------------------------------------------------------------
async def test_acquire_is_all_or_nothing_across_dimensions(harness: Harness) -> None:
    be = harness.backend
    requests, tokens = bucket("rpm", 5, 0.001), bucket("tpm", 100, 0.001)
    assert (await be.acquire(AcquireRequest(slots=(slot("tenant", "x", 1),)))).granted
    # Buckets have room, but the tenant's slot is taken: nothing may be debited.
    blocked = AcquireRequest(
        debits=(Debit(requests, 1), Debit(tokens, 60)),
        slots=(slot("res", "y", 3), slot("tenant", "y", 1)),
    )
    result = await be.acquire(blocked)
    assert not result.granted and result.refused == ("tenant",)
    assert await be.level(requests) == pytest.approx(5.0)
    assert await be.level(tokens) == pytest.approx(100.0)
    assert await be.slots_in_use("res") == 0
    # Every refusing dimension is named, not just the first.
    too_big = AcquireRequest(
        debits=(Debit(requests, 1), Debit(tokens, 101)), slots=(slot("tenant", "y", 1),)
    )
    assert set((await be.acquire(too_big)).refused) == {"tenant", "tpm"}
    await be.release_slot("tenant", "x")
    assert (await be.acquire(blocked)).granted
    assert await be.level(requests) == pytest.approx(4.0, abs=0.01)
    assert await be.level(tokens) == pytest.approx(40.0, abs=0.01)
    assert await be.slots_in_use("res") == 1


async def test_concurrent_acquires_never_exceed_the_limit(harness: Harness) -> None:
    be = harness.backend
    slot_results = await asyncio.gather(
        *(be.acquire(AcquireRequest(slots=(slot("s", f"t{i}", 10),))) for i in range(200))
    )
    assert sum(r.granted for r in slot_results) == 10
    assert await be.slots_in_use("s") == 10
    b = bucket("b", 10, 0.001)
    bucket_results = await asyncio.gather(*(be.acquire(take(b)) for _ in range(200)))
    assert sum(r.granted for r in bucket_results) == 10


# -- gates and the adaptive factor -----------------------------------------------------------
async def test_a_paused_gate_refuses_until_it_opens(harness: Harness) -> None:
    be = harness.backend
    req = AcquireRequest(debits=(Debit(bucket(), 1),), gates=("g",))
    assert await be.pause("g", 0.3) == pytest.approx(0.3, abs=0.01)
    assert await be.pause("g", 0.1) == 0.0  # never shortens
    result = await be.acquire(req)
    assert not result.granted and result.refused == ("g",)
    assert result.retry_in is not None and 0.1 < result.retry_in <= 0.3 + 1e-6
    assert await be.level(bucket()) == pytest.approx(5.0)  # nothing taken

    async def opened() -> bool:
        return (await be.acquire(req)).granted

    await eventually(opened, harness, 0.05)
    assert await be.paused_for("g") == 0.0


async def test_an_estimate_is_cut_once_per_round_trip_and_grows_back(harness: Harness) -> None:
    be = harness.backend
    assert await be.estimates("e") == {}
    granted = await be.acquire(take(bucket()))
    await harness.advance(0.01)
    assert await be.cut("e", "requests", 8.0, floor=1.0, granted_at=granted.at) == 8.0
    # Another refusal of the same round (granted before the cut): no second cut.
    assert await be.cut("e", "requests", 4.0, floor=1.0, granted_at=granted.at) == 8.0
    await harness.advance(0.01)
    later = await be.acquire(take(bucket()))
    await harness.advance(0.01)
    assert await be.cut("e", "requests", 0.5, floor=2.0, granted_at=later.at) == 2.0  # floored
    fields = await be.estimates("e")
    assert fields["requests"] == 2.0 and fields["requests:b"] == 2.0 and fields["requests:n"] == 2
    # Growth waits for the interval since the last change, then steps; the cap removes it.
    grow = {"start": 0.0, "step": 1.5, "cap": 4.0}
    assert await be.grow("e", "requests", **grow, interval_s=30) == 2.0

    async def stepped() -> bool:
        return await be.grow("e", "requests", **grow, interval_s=0.1) == 3.5

    await eventually(stepped, harness, 0.05)
    assert await be.grow("e", "requests", **grow, interval_s=0) == 4.0
    assert "requests" not in await be.estimates("e")  # at the cap: the cap is in force again
    # An absent estimate grows from its start value (slow start), unbounded.
    up = {"start": 4.0, "step": 1.0, "cap": math.inf, "interval_s": 0}
    assert await be.grow("e", "concurrency", **up) == 5.0
    assert await be.grow("e", "concurrency", **up) == 6.0


async def test_after_a_cut_a_probe_waits_its_quiet_period_then_doubles(harness: Harness) -> None:
    be = harness.backend
    cut = await be.acquire(take(bucket()))
    assert await be.cut("e", "requests", 10.0, floor=1.0, granted_at=cut.at + 1) == 10.0
    fields = await be.estimates("e")
    assert fields["requests:c"] == pytest.approx(cut.at, abs=1.0)  # seconds, as granted_at
    probe = {"start": 0.0, "step": 1.0, "cap": math.inf, "interval_s": 0, "quiet_s": 0.2}
    assert await be.grow("e", "requests", **probe) == 10.0  # quiet: the cut may not be deep

    async def grown() -> bool:
        return await be.grow("e", "requests", **probe) == 11.0

    await eventually(grown, harness, 0.05)
    assert await be.grow("e", "requests", **probe) == 13.0  # each step twice the last
    assert await be.grow("e", "requests", **probe) == 17.0
    assert await be.cut("e", "requests", 12.0, floor=1.0, granted_at=math.inf) == 12.0
    await harness.advance(0.25)
    assert await be.grow("e", "requests", **probe) == 13.0  # a cut starts the probe over


async def test_the_meter_counts_grants_and_refusals_and_forgets(harness: Harness) -> None:
    be = harness.backend
    meter = Meter("m", tau_s=0.5)
    first = await be.acquire(AcquireRequest(slots=(slot("s", "a", 5),), meter=meter))
    second = await be.acquire(AcquireRequest(slots=(slot("s", "b", 5),), meter=meter))
    assert first.in_use == (1,) and second.in_use == (2,)
    await be.tick(meter, THROTTLED)
    await be.note("m", {"published:requests": 10.0})
    fields = await be.estimates("m", meter)
    assert fields[SENT] == pytest.approx(2.0, abs=0.1)
    assert fields[THROTTLED] == pytest.approx(1.0, abs=0.05)
    assert fields[SENT_SLOW] == pytest.approx(2.0, abs=0.1)
    assert fields[THROTTLED_SLOW] == pytest.approx(1.0, abs=0.05)
    assert fields["published:requests"] == 10.0
    await harness.advance(0.5)
    decayed = await be.estimates("m", meter)
    assert decayed[SENT] == pytest.approx(2.0 * math.exp(-1), rel=0.25)  # e^-1 per tau
    # The slow window: e^-1 per SLOW taus.
    assert decayed[SENT_SLOW] == pytest.approx(2.0 * math.exp(-1 / SLOW), rel=0.1)
    assert decayed[THROTTLED_SLOW] == pytest.approx(math.exp(-1 / SLOW), rel=0.1)
    refused = await be.acquire(AcquireRequest(slots=(slot("s", "a", 5),), meter=meter))
    assert not refused.granted and refused.in_use == ()
    assert (await be.estimates("m", meter))[SENT] == pytest.approx(decayed[SENT], rel=0.1)


async def test_backend_time_moves_forward(harness: Harness) -> None:
    first = await harness.backend.now()
    await harness.advance(0.05)
    assert await harness.backend.now() > first


# -- Redis only ------------------------------------------------------------------------------
async def test_unreachable_redis_raises_limiter_unavailable() -> None:
    backend = RedisLimiterBackend.from_url("redis://127.0.0.1:1/0", "x", timeout_s=0.5)
    try:
        with pytest.raises(LimiterUnavailable):
            await backend.acquire(take(bucket()))
        with pytest.raises(LimiterUnavailable):
            await backend.release_slot("s", "a")
    finally:
        await backend.aclose()


async def test_redis_keys_are_namespaced_and_expire(harness: Harness) -> None:
    if not isinstance(harness.backend, RedisLimiterBackend):
        pytest.skip("Redis layout")
    be = harness.backend
    b = bucket("r:llm:tokens", 10, 1.0)
    await be.acquire(AcquireRequest(debits=(Debit(b, 4),), slots=(slot("r:llm:slots", "t1", 3),)))
    client = be.client
    assert be.key("r:llm:tokens").startswith("floodway:{")
    ttl = await client.pttl(be.key("r:llm:tokens"))
    assert 0 < ttl <= 5000  # full again in 4 s (+1 s): then the key may go
    assert 0 < await client.pttl(be.key("r:llm:slots")) <= 30_000


async def _forget_everything(be: RedisLimiterBackend) -> None:
    """What a Redis restarted without persistence leaves of this deployment's state."""
    keys = [k async for k in be.client.scan_iter(match=be.key("*"))]
    if keys:
        await be.client.delete(*keys)


@pytest.fixture
async def redis_pair() -> AsyncIterator[tuple[RedisLimiterBackend, RedisLimiterBackend]]:
    """Two processes' backends on one deployment's keys, with a 0.3 s recovery window."""
    prefix = f"test-{uuid.uuid4().hex}"
    pair = [RedisLimiterBackend.from_url(REDIS_URL, prefix, recovery_s=0.3) for _ in range(2)]
    try:
        await pair[0].client.ping()
    except (OSError, aioredis.RedisError):
        for be in pair:
            await be.aclose()
        pytest.skip("no Redis at 127.0.0.1:6379")
    try:
        yield pair[0], pair[1]
    finally:
        await _forget_everything(pair[0])
        for be in pair:
            await be.aclose()


async def test_lost_redis_state_is_rebuilt_by_the_holders_before_anyone_is_admitted(
    redis_pair: tuple[RedisLimiterBackend, RedisLimiterBackend],
) -> None:
    """Redis restarted without persistence: the calls in flight still count."""
    be, _ = redis_pair
    first = await be.acquire(AcquireRequest(slots=(slot("s", "a", 1),)))
    assert first.granted and first.epoch > 0
    await _forget_everything(be)
    # The next look sees a new generation and closes the recovery gate: nothing is admitted...
    during = await be.acquire(AcquireRequest(slots=(slot("s", "b", 1),)))
    assert not during.granted and during.refused == (RECOVERING,)
    assert during.epoch > first.epoch
    assert during.retry_in is not None and 0 < during.retry_in <= 0.3
    # ... while the holder of the lost slot takes it again, and only a holder of a lost slot:
    assert await be.renew_slot("s", "a", 30.0, taken_in=first.epoch)
    assert not await be.renew_slot("s", "ghost", 30.0, taken_in=during.epoch)
    assert not await be.renew_slot("s", "unknown", 30.0)
    assert await be.slots_in_use("s") == 1
    await asyncio.sleep(during.retry_in + 0.05)
    after = await be.acquire(AcquireRequest(slots=(slot("s", "b", 1),)))
    assert not after.granted and after.refused == ("s",)  # the cap holds: "a" still runs
    await be.release_slot("s", "a")
    assert (await be.acquire(AcquireRequest(slots=(slot("s", "b", 1),)))).granted


async def test_a_fresh_process_that_finds_the_state_lost_does_not_open_the_gate_early(
    redis_pair: tuple[RedisLimiterBackend, RedisLimiterBackend],
) -> None:
    old, fresh = redis_pair
    assert (await old.acquire(AcquireRequest(slots=(slot("s", "a", 2),)))).granted
    await _forget_everything(old)
    # A process started after the loss knows no older generation: it cannot tell.
    assert (await fresh.acquire(AcquireRequest(slots=(slot("s", "b", 2),)))).granted
    # The first process that knew the old generation closes the gate for the rest of the
    # window, for everyone.
    late = await old.acquire(AcquireRequest(slots=(slot("t", "x", 2),)))
    assert not late.granted and late.refused == (RECOVERING,)
    refused = await fresh.acquire(AcquireRequest(slots=(slot("s", "c", 2),)))
    assert not refused.granted and refused.refused == (RECOVERING,)


async def test_a_brand_new_deployment_admits_at_once(
    redis_pair: tuple[RedisLimiterBackend, RedisLimiterBackend],
) -> None:
    be, other = redis_pair
    assert (await be.acquire(AcquireRequest(slots=(slot("s", "a", 2),)))).granted
    assert (await other.acquire(AcquireRequest(slots=(slot("s", "b", 2),)))).granted


# -- admission over each backend -------------------------------------------------------------
async def test_two_processes_sharing_a_backend_share_its_limits(harness: Harness) -> None:
    """Two LimitsAdmission instances over one backend stand for two worker processes over one
    Redis: together they never exceed the resource's slots or its tenant caps."""
    clock = FakeClock()  # only for aging: the backend keeps its own time
    workers = [
        LimitsAdmission(
            {"llm": ResourceConfig(concurrency=10, headroom=0.8)},
            {"chat": "llm"},
            TenantConfig(concurrency=3),
            harness.backend,
            clock,
        )
        for _ in range(2)
    ]
    ready = [
        Candidate(f"t{i}", "chat", f"tenant{i % 4}", Lane.BACKGROUND, 1.0, i, clock.now(), None)
        for i in range(40)
    ]
    first, second = await asyncio.gather(*(w.admit(ready, clock.now()) for w in workers))
    ids = [p.task_id for p in first + second]
    assert len(ids) == len(set(ids)) == 8  # 10 x 0.8, each task admitted once
    per_tenant = {t: sum(p.tenant == t for p in first + second) for t in {"tenant0", "tenant1"}}
    assert max(per_tenant.values()) <= 3
    for p in first:
        await workers[0].settle(p, Settlement(), clock.now())
    assert len(await workers[1].admit(ready, clock.now())) == len(first)


# -- calls a dead worker left running --------------------------------------------------------
async def test_a_held_slot_counts_until_it_expires_even_over_the_limit(harness: Harness) -> None:
    """A call whose worker died still runs at the provider: its slot counts, taken again over
    the limit if need be, until the call could have ended."""
    backend = harness.backend
    assert (await backend.acquire(AcquireRequest(slots=(slot("s", "a", limit=1),)))).granted
    await backend.hold_slot("s", "~orphan", 1.0)  # over the limit of 1: it must count
    assert await backend.slots_in_use("s") == 2
    await backend.release_slot("s", "a")
    refused = await backend.acquire(AcquireRequest(slots=(slot("s", "b", limit=1),)))
    assert not refused.granted and refused.refused == ("s",)
    await backend.hold_slot("s", "~orphan", 0.2)  # a hold never shortens a longer one
    await harness.advance(0.5)
    assert await backend.slots_in_use("s") == 1
    await harness.advance(0.7)
    assert await backend.slots_in_use("s") == 0


async def test_a_resubmission_takes_over_its_own_orphaned_slot(harness: Harness) -> None:
    """The provider joins a resubmission with the same key to the running job: it adds
    nothing there, so it takes the orphan's slot over instead of waiting for a free one."""
    backend = harness.backend
    await backend.hold_slot("s", "~t1", 30.0)
    full = AcquireRequest(slots=(slot("s", "other", limit=1),))
    assert not (await backend.acquire(full)).granted  # nobody else gets the orphan's room
    again = AcquireRequest(slots=(SlotClaim("s", 1, "t1", 30.0, replaces="~t1"),))
    assert (await backend.acquire(again)).granted
    assert await backend.slots_in_use("s") == 1  # one call for one job, still
    await backend.release_slot("s", "t1")
    assert await backend.slots_in_use("s") == 0


# -- the rules of learned limits, over each backend (two processes sharing it) ---------------
def fleet(
    harness: Harness, resource: ResourceConfig, name: str = "api", **tuning: float
) -> list[LimitsAdmission]:
    # The passes below are made at 0.0 on this clock; the backend keeps its own time.
    clock = FakeClock(start=0.0)
    knobs = AdmissionTuning(meter_tau_s=0.5, **tuning)  # type: ignore[arg-type]
    return [
        LimitsAdmission(
            {name: resource}, {"gen": name}, TenantConfig(), harness.backend, clock, knobs
        )
        for _ in range(2)
    ]


def ready(n: int, prefix: str = "t") -> list[Candidate]:
    return [
        Candidate(f"{prefix}{i}", "gen", "a", Lane.BACKGROUND, 1.0, i, 0.0, None) for i in range(n)
    ]


async def test_a_limit_429_pauses_every_process_and_noise_pauses_none(harness: Harness) -> None:
    a, b = fleet(harness, ResourceConfig(adaptive=True))
    (p,) = await a.admit(ready(1), 0.0)
    await a.settle(p, Settlement(throttled=True, retry_after=0.3), 0.0)  # nothing known: a limit
    assert await b.admit(ready(3, "b"), 0.0) == []
    snap = (await b.snapshot())["api"]
    assert 0 < snap.paused_for <= 0.3 and snap.held_back_by == {"pause": 3}

    async def reopened() -> bool:
        return bool(await b.admit(ready(1, "late"), 0.0))

    await eventually(reopened, harness, 0.05)
    # At a configured cap, a spontaneous 429 is noise: nobody pauses, nothing is lowered.
    c, d = fleet(harness, ResourceConfig(concurrency=2, adaptive=True), "capped")
    first, _second = await c.admit(ready(2, "c"), 0.0)
    await c.settle(first, Settlement(throttled=True, retry_after=5.0), 0.0)
    assert [p.task_id for p in await d.admit(ready(1, "d"), 0.0)] == ["d0"]
    snap = (await d.snapshot())["capped"]
    assert snap.paused_for == 0 and snap.limits["concurrency"].value == 2
    assert (await c.snapshot())["capped"].throttles_noise == 1


async def test_a_learned_rate_is_one_for_the_fleet(harness: Harness) -> None:
    a, b = fleet(harness, ResourceConfig(adaptive=True), initial_concurrency=20)
    accepted = await a.admit(ready(10), 0.0)
    for p in accepted:
        await a.settle(p, Settlement(), 0.0)
    (refused,) = await a.admit(ready(1, "x"), 0.0)
    await a.settle(refused, Settlement(throttled=True, retry_after=0.0), 0.0)
    rate = (await b.snapshot())["api"].limits["requests"]
    assert rate.source == "learned"
    # 0.9 x the ~10 accepted over the meter's half second (decayed): about 18/s, 1,080/min.
    assert 400 < rate.value < 10 / 0.5 * 0.9 * 60 + 1
    assert len(await b.admit(ready(20, "b"), 0.0)) < 20  # its bucket holds b back too


async def test_a_concurrency_refusal_sets_the_fleet_s_cap(harness: Harness) -> None:
    a, b = fleet(harness, ResourceConfig(adaptive=True), initial_concurrency=4)
    mine = await a.admit(ready(3), 0.0)
    theirs = await b.admit(ready(3, "b"), 0.0)
    assert len(mine) == 3 and len(theirs) == 1  # slow start: 4 in flight for the fleet
    refused = theirs[0]  # the 4th in flight: the provider holds 3
    reason = "rate_limited: too many concurrent requests"
    await b.settle(refused, Settlement(throttled=True, retry_after=1.0, reason=reason), 0.0)
    cap = (await a.snapshot())["api"].limits["concurrency"]
    assert cap.value == 3 and cap.source == "learned" and not cap.slow_start
    assert (await a.snapshot())["api"].paused_for == 0  # the cap holds calls back, not a pause
    assert await a.admit(ready(1, "more"), 0.0) == []
    await a.settle(mine[0], Settlement(), 0.0)
    assert len(await b.admit(ready(1, "more"), 0.0)) == 1


async def test_published_limits_set_what_is_not_configured_and_only_lower_the_rest(
    harness: Harness,
) -> None:
    openai = {"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "599"}
    for configured, value, source in (
        (0, 600, "header"),
        (300, 300, "configured"),
        (900, 600, "header"),
    ):
        name = f"api{configured}"
        resource = ResourceConfig(requests_per_minute=configured, adaptive=True)
        a, b = fleet(harness, resource, name)
        (p,) = await a.admit(ready(1), 0.0)
        await a.settle(p, Settlement(headers=openai), 0.0)
        rate = (await b.snapshot())[name].limits["requests"]
        assert (rate.value, rate.source) == (pytest.approx(value), source), configured
