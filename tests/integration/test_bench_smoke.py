"""Smoke runs of the benchmarks at small sizes: the real engine against the simulator over
HTTP, real worker and server processes. Only counts and invariants are checked, never
timings (a shared, noisy machine would make any time threshold flaky)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import http_load, openai_front, peers, quota
from harness.fleet import PG_URL

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


async def test_q7_quick_learns_a_cap_near_the_provider_s() -> None:
    figures = await quota.q7_run(seed=1, quick=True)
    assert figures["lost"] == 0 and figures["failed"] == 0 and figures["double_charged"] == 0
    assert figures["concurrency_source"] == "learned"
    # Set just below the calls in flight at a refusal, probed up one slot at a time.
    assert figures["learned_concurrency"] is not None and figures["learned_concurrency"] <= 12
    assert figures["rate_limited_429"] == figures["throttles_limit"] + figures["throttles_noise"]


async def test_q8_quick_spontaneous_429s_are_noise_at_a_configured_cap() -> None:
    figures = await quota.q8_run(seed=3, quick=True)
    assert figures["lost"] == 0 and figures["failed"] == 0 and figures["double_charged"] == 0
    assert figures["throttles_limit"] == 0 and figures["pauses"] == 0
    assert figures["throttles_noise"] == figures["rate_limited_429"]
    assert figures["learned_concurrency"] == 10, "the configured cap is never lowered by noise"


async def test_openai_front_quick_answers_each_request_once_within_the_cap(tmp_path: Path) -> None:
    batch = await openai_front.o1_batch(40, tmp_path)
    figures = batch["figures"]
    assert figures["answered_once"] is True and figures["billed"] == 40
    assert figures["provider_429s"] == 20 and figures["provider_peak_concurrency"] <= 10
    (tmp_path / "o2").mkdir()
    waiting = await openai_front.o2_waiting(20, tmp_path / "o2")
    assert waiting["figures"]["answered_200"] == 20 and waiting["figures"]["client_429s"] == 0


async def test_peers_drains_every_task_on_both_queues() -> None:
    """T3 at a small size: a default floodway worker process and a default Dramatiq process
    each drain what another process submitted (a queue that lost a task never ends)."""
    floodway = await peers.one_run("sqlite", 1000, PG_URL)
    assert floodway["drained_per_s"] > 0 and floodway["ledger_drained_per_s"] > 0
    assert (await peers.one_run("dramatiq", 1000, PG_URL))["drained_per_s"] > 0


async def test_http_load_every_submit_is_accepted() -> None:
    """H1 at a small size against a real `floodway serve`: every single submit and every
    batch is answered 202 (the load stops with the answer otherwise)."""
    args = argparse.Namespace(submits=100, clients=10, batch_size=50, batches=2, wrk_seconds=1)
    figures = await http_load.one_run("serve-sqlite", PG_URL, args)
    assert figures["p50_ms"] <= figures["p99_ms"]
    assert figures["server_cpu_ms"] > 0 and figures["batch_tasks_per_s"] > 0
    # wrk is a bench tool, not a CI dependency: its figures are there exactly when it is
    assert ("wrk_submits_per_s" in figures) == (http_load.wrk_missing() is None)
    if "wrk_submits_per_s" in figures:
        assert figures["wrk_submits_per_s"] > 0 and figures["wrk_p50_ms"] <= figures["wrk_p99_ms"]
