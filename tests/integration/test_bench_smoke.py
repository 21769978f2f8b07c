"""Smoke run of the quota benchmarks at their quick size: the real engine against the
simulator over HTTP. Only counts and invariants are checked, never timings (a shared,
noisy machine would make any time threshold flaky)."""

from __future__ import annotations

import pytest

from bench import quota

pytestmark = pytest.mark.slow


async def test_q1_quick_every_task_terminal_and_billed_once() -> None:
    figures = await quota.q1_run(seed=1, quick=True)
    assert figures["tasks"] == 40
    assert figures["lost"] == 0, "every task ends terminal"
    assert figures["failed"] == 0
    assert figures["double_charged"] == 0
    assert figures["charged"] == 40, "a 5xx is not billed, so 40 charges for 40 tasks"
    assert figures["peak_concurrency"] <= 10, "the provider cap is never exceeded"
    assert figures["rate_limited_429"] == 0


async def test_q3_quick_big_task_finishes_in_both_orders() -> None:
    figures = await quota.q3_run(seed=1, quick=True)
    assert figures["big_finished"] is True
    assert figures["lost"] == 0
    assert figures["failed"] == 0
    assert figures["double_charged"] == 0
    # The figures the bench compares exist and are positive (their size is not judged here).
    assert figures["small_mean_s"] > 0 and figures["small_mean_fifo_s"] > 0
