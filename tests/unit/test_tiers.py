"""The one rule that picks a task's tier (core/tiers.py), over random kinds and deadlines."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from floodway.core.spend import Price, Usage
from floodway.core.tiers import BY_PRICE, Tier, choose_tier, turnarounds
from floodway.kinds import TierPlan

offered = st.sets(st.sampled_from(["flex", "batch"])).map(lambda s: ["sync", *sorted(s)])
seconds = st.floats(min_value=1, max_value=48 * 3600, allow_nan=False)


@given(offered, st.none() | seconds, seconds, seconds, st.booleans())
def test_the_cheapest_tier_that_leaves_room_for_a_sync_call_before_the_deadline(
    allowed: list[Tier], remaining: float | None, flex: float, batch: float, interactive: bool
) -> None:
    times = turnarounds(60.0, {"flex": flex, "batch": batch})
    tier = choose_tier(allowed, pinned=None, interactive=interactive, remaining_s=remaining,
                       times=times)  # fmt: skip
    assert tier in allowed
    if interactive:
        assert tier == "sync"
        return
    fits = [t for t in allowed if t == "sync" or remaining is None
            or times.expected(t) + 60.0 <= remaining]  # fmt: skip
    assert tier == min(fits, key=BY_PRICE.index)  # the cheapest that fits


def test_a_pin_wins_and_measured_turnarounds_replace_the_estimate() -> None:
    times = turnarounds(60.0, {})
    assert choose_tier(["sync", "batch"], pinned="sync", interactive=False, remaining_s=None,
                       times=times) == "sync"  # fmt: skip
    assert choose_tier(["sync", "batch"], pinned=None, interactive=False, remaining_s=1800,
                       times=times) == "sync"  # an hour's estimate does not fit 30 min  # fmt: skip
    times.observe("batch", 600)
    assert times.expected("batch") == 600
    assert choose_tier(["sync", "batch"], pinned=None, interactive=False, remaining_s=1800,
                       times=times) == "batch"  # fmt: skip


def test_the_batch_price_is_the_discounted_or_the_explicit_one() -> None:
    usage = Usage(1e6, 1e6, tier="batch")
    assert Price(2.0, 8.0).on("batch").cost(usage) == 5.0
    assert Price(2.0, 8.0, batch_input_per_1m=0.5).on("flex").cost(usage) == 4.5
    assert Price(2.0, 8.0).on("sync").cost(usage) == 10.0


@given(st.none() | seconds, seconds)
def test_a_task_due_before_batch_by_is_one_the_rule_would_not_batch(
    remaining: float | None, batch: float
) -> None:
    # The store takes work off the batch tier for a waiting task due before batch_by: the
    # same line as the rule's, so such a task alone would not have gone on the batch tier.
    plan = TierPlan(offered=("sync", "batch"), times=turnarounds(60.0, {"batch": batch}))
    now = 1000.0
    due_before = remaining is not None and now + remaining < plan.batch_by(now)
    tier = choose_tier(plan.offered, pinned=None, interactive=False, remaining_s=remaining,
                       times=plan.times)  # fmt: skip
    assert (tier != "batch") == due_before


@given(st.none() | st.integers(1, 500), st.integers(0, 600), st.integers(0, 600))
def test_the_room_a_batch_queue_limit_leaves_is_never_past_it(
    limit: int | None, enqueued: int, queued: int
) -> None:
    room = TierPlan(queue_limit=limit).room(enqueued, queued)
    assert 0 <= room <= queued
    if limit is None:
        assert room == queued
    else:
        assert enqueued + room <= max(limit, enqueued)
        assert room == min(queued, max(0, limit - enqueued))  # as much as fits
