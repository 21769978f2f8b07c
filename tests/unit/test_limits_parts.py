"""The pure parts of floodway.limits: capacity math, dispatch order, rate-limit headers."""

from __future__ import annotations

import pytest

from floodway.config import ResourceConfig
from floodway.core.task import Lane
from floodway.limits.headers import Remaining, exhausted_pause, parse_reset, read_remaining
from floodway.limits.order import Rotation, TenantRounds, aged, effective_cost, lane_rounds
from floodway.limits.plan import ResourcePlan, default_burst_s
from floodway.store.base import Candidate

T0 = 1_700_000_000.0


def cand(task_id: str, cost: float = 0.0, tenant: str = "a", created_at: float = T0) -> Candidate:
    return Candidate(task_id, "k", tenant, Lane.BACKGROUND, cost, 0, created_at, None)


# -- plan ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headroom", "burst"), [(0.8, 15.0), (0.5, 60.0), (0.25, 60.0), (1.0, 1.0), (0.99, 1.0)]
)
def test_default_burst(headroom: float, burst: float) -> None:
    assert default_burst_s(headroom) == pytest.approx(burst)


@pytest.mark.parametrize("headroom", [0.5, 0.6, 0.8, 0.9])
def test_default_bucket_plus_a_minute_of_refill_fits_the_published_limit(headroom: float) -> None:
    plan = ResourcePlan.build("r", ResourceConfig(tokens_per_minute=90_000, headroom=headroom))
    assert plan.tokens is not None
    assert plan.tokens.capacity + 60 * plan.tokens.rate_per_s <= 90_000 + 1e-6


def test_explicit_burst_and_concurrency_headroom() -> None:
    cfg = ResourceConfig(concurrency=3, tokens_per_minute=6000, headroom=0.7, burst=30)
    plan = ResourcePlan.build("r", cfg)
    assert plan.concurrency == 2  # floor(2.1)
    assert plan.tokens is not None
    assert plan.tokens.rate_per_s == pytest.approx(70.0)
    assert plan.tokens.capacity == pytest.approx(2100.0)
    assert plan.requests is None
    assert ResourcePlan.build("r", ResourceConfig(concurrency=1, headroom=0.1)).concurrency == 1


def test_concurrency_with_the_adaptive_factor() -> None:
    plan = ResourcePlan.build("r", ResourceConfig(concurrency=10))
    assert [plan.concurrency_at(f) for f in (1.0, 0.5, 0.25, 0.05)] == [10, 5, 2, 1]


# -- order -----------------------------------------------------------------------------------
def test_effective_cost_falls_to_zero_over_aging() -> None:
    c = cand("x", cost=1000, created_at=T0)
    assert effective_cost(c, T0, 60) == 1000
    assert effective_cost(c, T0 + 30, 60) == pytest.approx(500)
    assert effective_cost(c, T0 + 90, 60) == 0
    assert effective_cost(c, T0 + 90, 0) == 1000  # aging off
    assert not aged(c, T0 + 59, 60) and aged(c, T0 + 60, 60) and not aged(c, T0 + 1e6, 0)


def test_rounds_give_each_tenant_one_admission_per_turn() -> None:
    queues = {"a": [cand("a1"), cand("a2"), cand("a3")], "b": [cand("b1"), cand("b2")]}
    rounds = TenantRounds(queues, ["a", "b"])
    seen = []
    for c in rounds:
        seen.append(c.task_id)
        if c.task_id != "a1":  # a1 refused: a2 is offered on the same turn
            rounds.admitted()
    assert seen == ["a1", "a2", "b1", "a3", "b2"]


def test_rotation_starts_with_the_least_recently_served() -> None:
    rotation = Rotation()
    tiebreak = {t: (0.0, 0.0, 0) for t in "abc"}
    assert rotation.order("abc", tiebreak) == ["a", "b", "c"]
    rotation.served("a")
    rotation.served("c")
    assert rotation.order("abc", tiebreak) == ["b", "a", "c"]


def test_rotation_memory_is_bounded() -> None:
    rotation = Rotation(max_tenants=10)
    for i in range(100):
        rotation.served(f"t{i}")
    assert len(rotation._served) <= 10
    assert "t99" in rotation._served


def test_lane_rounds_sorts_each_tenant_shortest_first() -> None:
    cands = [cand("big", 900), cand("small", 10), cand("mid", 100)]
    cands.append(Candidate("ia", "k", "a", Lane.INTERACTIVE, 1, 0, T0, None))
    rounds = lane_rounds(cands, Lane.BACKGROUND, T0, 60, Rotation())
    assert [c.task_id for c in rounds] == ["small", "mid", "big"]


# -- headers ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("6m0s", 360.0),
        ("1.5s", 1.5),
        ("20ms", 0.02),
        ("1h2m3s", 3723.0),
        ("30", 30.0),
        (" 2 ", 2.0),
        (str(T0 + 12), 12.0),  # a Unix time
        ("soon", None),
        ("5x", None),
        ("", None),
    ],
)
def test_parse_reset(value: str, seconds: float | None) -> None:
    parsed = parse_reset(value, T0)
    assert parsed == (None if seconds is None else pytest.approx(seconds))


def test_read_remaining_is_case_insensitive_and_skips_junk() -> None:
    found = read_remaining(
        {
            "X-RateLimit-Remaining-Requests": "7",
            "X-RateLimit-Limit-Requests": "60",
            "X-RateLimit-Reset-Requests": "1s",
            "x-ratelimit-remaining-tokens": "lots",
        },
        T0,
    )
    assert found == [Remaining("requests", 7.0, 60.0, 1.0)]


def test_exhausted_pause() -> None:
    assert exhausted_pause(Remaining("requests", 3, 60, 30), 1) is None
    assert exhausted_pause(Remaining("requests", 0, 60, 30), 1) == pytest.approx(0.5)
    assert exhausted_pause(Remaining("requests", 0, None, 30), 1) == 30
    assert exhausted_pause(Remaining("tokens", 100, 1000, 60), 400) == pytest.approx(18)
    assert exhausted_pause(Remaining("requests", 0, 60, None), 1) is None
