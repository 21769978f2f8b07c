"""The pure parts of floodway.limits: capacity math, dispatch order, rate-limit headers, and
the rules that tell a limit from noise."""

from __future__ import annotations

import pytest

from floodway.config import ResourceConfig
from floodway.core.task import Candidate, Lane
from floodway.limits.headers import (
    CONCURRENCY,
    REQUESTS,
    TOKENS,
    Quota,
    exhausted_pause,
    parse_reset,
    read_quotas,
)
from floodway.limits.learning import (
    CONFIGURED,
    HEADER,
    LEARNED,
    Limit,
    Persistence,
    Throttle,
    in_force,
    judge,
)
from floodway.limits.order import Rotation, TenantRounds, aged, effective_cost, lane_rounds
from floodway.limits.plan import ResourcePlan, default_burst_s

T0 = 1_700_000_000.0


def cand(
    task_id: str, cost: float = 0.0, tenant: str = "a", rank_at: float = T0, seq: int = 0
) -> Candidate:
    return Candidate(task_id, "k", tenant, Lane.BACKGROUND, cost, seq, rank_at, None)


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


def test_a_lowered_rate_keeps_the_configured_capacity_and_a_learned_one_bursts_a_second() -> None:
    plan = ResourcePlan.build("r", ResourceConfig(requests_per_minute=600, headroom=0.8))
    lowered = plan.bucket(REQUESTS, 2.0, published=False)
    assert lowered.capacity == pytest.approx(120.0) and lowered.refill_per_s == 2.0
    bare = ResourcePlan.build("r", ResourceConfig(adaptive=True, headroom=0.8))
    assert bare.bucket(REQUESTS, 10.0, published=False).capacity == pytest.approx(10.0)
    assert bare.bucket(REQUESTS, 10.0, published=True).capacity == pytest.approx(150.0)


# -- order -----------------------------------------------------------------------------------
def test_effective_cost_falls_to_zero_over_aging() -> None:
    c = cand("x", cost=1000, rank_at=T0)
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


def test_lane_rounds_serve_equal_costs_by_rank_then_seq_and_tenants_in_turn() -> None:
    # A job's step ranks as of its job's submit (T0): ahead of the first steps of later jobs
    # (T0 + 1, T0 + 2) though it was written last, and its wait for aging counts from T0.
    first_of_late = cand("late-s1", rank_at=T0 + 2, seq=1)
    first_of_next = cand("next-s1", rank_at=T0 + 1, seq=2)
    last_of_early = cand("early-s5", rank_at=T0, seq=9)
    other = cand("b-s1", tenant="b", rank_at=T0 + 1, seq=3)
    cands = [first_of_late, first_of_next, last_of_early, other]
    rounds = lane_rounds(cands, Lane.BACKGROUND, T0 + 5, 60, Rotation())
    seen = []
    for c in rounds:
        seen.append(c.task_id)
        rounds.admitted()
    assert seen == ["early-s5", "b-s1", "next-s1", "late-s1"]
    assert effective_cost(cand("x", 100, rank_at=T0), T0 + 30, 60) == pytest.approx(50)
    assert aged(last_of_early, T0 + 60, 60)


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


def test_openai_headers_are_case_insensitive_and_skip_junk() -> None:
    found = read_quotas(
        {
            "X-RateLimit-Remaining-Requests": "7",
            "X-RateLimit-Limit-Requests": "60",
            "X-RateLimit-Reset-Requests": "1s",
            "x-ratelimit-remaining-tokens": "lots",
        },
        T0,
    )
    assert found == [Quota(REQUESTS, 60.0, 60.0, 7.0, 1.0)]
    assert found[0].per_second == pytest.approx(1.0)


def test_anthropic_headers_with_rfc3339_resets_and_three_token_quotas() -> None:
    found = read_quotas(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:50Z",
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "39000",
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "7000",
        },
        1_700_000_000.0,  # 2023-11-14T22:13:20Z
    )
    assert found[0] == Quota(REQUESTS, 50.0, 60.0, 0.0, pytest.approx(30.0))
    assert [(q.dimension, q.limit) for q in found[1:]] == [(TOKENS, 40000.0), (TOKENS, 8000.0)]


def test_ietf_structured_policy_and_current_values() -> None:
    found = read_quotas(
        {
            "RateLimit-Policy": '"burst";q=100;w=60, "inflight";q=5;qu="concurrent-requests", '
            '"bytes";q=1000;qu="content-bytes"',
            "RateLimit": '"burst";r=42;t=30',
        },
        T0,
    )
    assert found == [
        Quota(REQUESTS, 100.0, 60.0, 42.0, 30.0),
        Quota(CONCURRENCY, 5.0, None, None, None),
    ]
    assert found[1].per_second is None


def test_ietf_earlier_drafts_triple() -> None:
    found = read_quotas(
        {
            "RateLimit-Limit": "100",
            "RateLimit-Remaining": "3",
            "RateLimit-Reset": "7",
            "RateLimit-Policy": "100;w=10",
        },
        T0,
    )
    assert found == [Quota(REQUESTS, 100.0, 10.0, 3.0, 7.0)]
    assert found[0].per_second == pytest.approx(10.0)


@pytest.mark.parametrize(
    "headers",
    [
        {"RateLimit-Policy": "garbage;;;(", "RateLimit": '"x";r=oops'},
        {"RateLimit-Policy": '"p";q=-5;w=60'},
        {"anthropic-ratelimit-requests-limit": "nan"},
        {"RateLimit-Limit": "-1"},
    ],
)
def test_malformed_headers_publish_nothing(headers: dict[str, str]) -> None:
    assert read_quotas(headers, T0) == []


def test_exhausted_pause() -> None:
    assert exhausted_pause(Quota("requests", 60, 60, 3, 30), 1) is None
    assert exhausted_pause(Quota("requests", 60, 60, 0, 30), 1) == pytest.approx(0.5)
    assert exhausted_pause(Quota("requests", None, 60, 0, 30), 1) == 30
    assert exhausted_pause(Quota("tokens", 1000, 60, 100, 60), 400) == pytest.approx(18)
    assert exhausted_pause(Quota("requests", 60, 60, 0, None), 1) is None
    assert exhausted_pause(Quota("requests", 60, 60, None, 10), 1) is None


# -- limits in force and the judge of a 429 ---------------------------------------------------
def test_limit_sources_in_force() -> None:
    def of(configured: float | None, estimates: dict[str, float], **kw: object) -> Limit | None:
        opts: dict[str, object] = {"adaptive": True, "headroom": 0.5, "initial_concurrency": 4}
        opts.update(kw)
        return in_force(REQUESTS, configured, estimates, **opts)  # type: ignore[arg-type]

    assert of(None, {}) is None
    assert of(5.0, {}) == Limit(5.0, CONFIGURED, 5.0)
    # A published figure (at headroom) below the configured one wins; above, it is ignored.
    assert of(5.0, {"published:requests": 6.0}) == Limit(3.0, HEADER, 3.0)
    assert of(5.0, {"published:requests": 20.0}) == Limit(5.0, CONFIGURED, 5.0)
    assert of(None, {"published:requests": 20.0}) == Limit(10.0, HEADER, 10.0)
    # Learning only lowers what is configured or published, and sets what is not.
    assert of(5.0, {"requests": 2.0}) == Limit(2.0, LEARNED, 5.0)
    assert of(5.0, {"requests": 7.0}) == Limit(5.0, CONFIGURED, 5.0)
    assert of(None, {"requests": 7.0}) == Limit(7.0, LEARNED)
    # A resource that is not adaptive reads its configuration only.
    assert of(5.0, {"requests": 2.0, "published:requests": 2.0}, adaptive=False) == Limit(
        5.0, CONFIGURED, 5.0
    )
    # Slow start: an adaptive resource with no known in-flight cap starts with a few.
    slow = in_force(CONCURRENCY, None, {}, adaptive=True, headroom=1.0, initial_concurrency=4)
    assert slow == Limit(4.0, LEARNED, guess=True)
    bounded = in_force(
        CONCURRENCY,
        None,
        {"concurrency": 7.0, "concurrency:n": 1.0},
        adaptive=True,
        headroom=1.0,
        initial_concurrency=4,
    )
    assert bounded == Limit(7.0, LEARNED)


def throttle(**kw: object) -> Throttle:
    facts: dict[str, object] = {
        "limits": {},
        "in_flight": None,
        "sending_rate": None,
        "adaptive": True,
        "concurrency_hint": False,
        "exhausted": frozenset(),
        "persistent": False,
    }
    facts.update(kw)
    return Throttle(**facts)  # type: ignore[arg-type]


def test_a_429_at_a_configured_limit_is_noise_unless_it_persists() -> None:
    at_cap = {CONCURRENCY: Limit(10, CONFIGURED, 10), REQUESTS: None}
    assert not judge(throttle(limits=at_cap, in_flight=10)).limit
    # Well under the cap, the unknown rate is no suspect either: it did not bind at 10.
    assert not judge(throttle(limits=at_cap, in_flight=3)).limit
    persisting = judge(throttle(limits=at_cap, in_flight=10, persistent=True))
    assert persisting.limit and persisting.dimensions == {CONCURRENCY, REQUESTS}


def test_the_first_429_of_a_resource_nothing_is_known_of_is_a_limit() -> None:
    window = {CONCURRENCY: Limit(8, LEARNED, guess=True)}
    verdict = judge(throttle(limits=window, in_flight=8))
    assert verdict.limit and verdict.dimensions == {CONCURRENCY, REQUESTS}
    # A slow-start window is no evidence: a 429 under it is still a first contact.
    assert judge(throttle(limits=window, in_flight=1)).dimensions == {REQUESTS}
    # Not adaptive: nothing to learn, and nothing says it is more than noise.
    assert not judge(throttle(adaptive=False)).limit


def test_a_429_well_under_the_learned_estimates_is_noise() -> None:
    learned = {CONCURRENCY: Limit(10, LEARNED), REQUESTS: Limit(10.0, LEARNED)}
    assert not judge(throttle(limits=learned, in_flight=2, sending_rate=3.0)).limit
    tracked = judge(throttle(limits=learned, in_flight=2, sending_rate=9.5))
    assert tracked.limit and tracked.dimensions == {REQUESTS}


def test_a_concurrency_refusal_is_about_concurrency_alone() -> None:
    learned = {CONCURRENCY: Limit(10, LEARNED), REQUESTS: None}
    verdict = judge(throttle(limits=learned, in_flight=10, concurrency_hint=True))
    assert verdict.limit and verdict.concurrency_only
    assert not judge(throttle(limits=learned, in_flight=1, concurrency_hint=True)).limit


def test_spent_headers_make_a_limit_even_at_a_configured_rate() -> None:
    limits = {REQUESTS: Limit(10.0, CONFIGURED, 10.0)}
    verdict = judge(throttle(limits=limits, sending_rate=10.0, exhausted=frozenset({REQUESTS})))
    assert verdict.limit and verdict.dimensions == {REQUESTS}


def test_persistence_needs_a_share_and_a_count() -> None:
    p = Persistence(tau_s=10.0, share=0.1, least=3.0)
    for i in range(40):
        p.record(T0 + i * 0.1, throttled=i in (5, 20))  # 2 in 40: noise
    assert not p.persistent(T0 + 4)
    for i in range(3):
        p.record(T0 + 4 + i * 0.1, throttled=True)
    assert p.persistent(T0 + 4.3)
    assert not p.persistent(T0 + 100)  # forgotten
