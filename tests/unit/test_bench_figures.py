"""The benchmarks' own arithmetic: where a fleet makespan's excess over the optimum went, J1's
bounds and hand-offs, and how the report judges the T3, H1 and J1 rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import jobs, report
from bench.fleet import ProviderClock


def test_idle_parts_add_up_to_the_excess_over_the_optimum() -> None:
    # Cap 2: A and B start late (0.1 s, 0.3 s), C takes A's slot 0.1 s after A ends, and B's
    # slot idles from 1.3 s to the end at 2.0 s.
    clock = ProviderClock(
        started={"A": 0.1, "B": 0.3, "C": 1.2}, ended={"A": 1.1, "B": 1.3, "C": 2.0}
    )
    idle = clock.idle_s(cap=2, t0=0.0)
    assert idle == {
        "before_first_requests": pytest.approx(0.2),
        "between_requests": pytest.approx(0.05),
        "after_last_requests": pytest.approx(0.35),
    }
    optimum = clock.busy_s() / 2
    assert sum(idle.values()) == pytest.approx(2.0 - optimum)


def test_idle_parts_need_a_full_cap_of_requests() -> None:
    assert ProviderClock(started={"A": 0.1}, ended={"A": 1.0}).idle_s(cap=2, t0=0.0) == {}


def test_t3_rows_judge_each_setup_against_dramatiq_in_the_same_run() -> None:
    run = {"drained_per_s": 0.0, "runs": [{}]}
    data = {
        "scenario": "T3",
        "tasks": 10_000,
        "rows": {
            "sqlite": {**run, "drained_per_s": 4_000.0},
            "pg-1": {**run, "drained_per_s": 3_999.0},
            "dramatiq": {**run, "drained_per_s": 2_000.0},
        },
    }
    rows = report.read_peers(Path("peers-T3.json"), data)
    assert [(r.id, r.passed) for r in rows] == [("T3", True), ("T3", False)]
    assert "2x" in rows[0].figures and "PostgreSQL" in rows[1].scenario


def test_h1_rows_need_rate_p99_and_batches_all_met() -> None:
    met = {
        "submits_per_s": 1_500.0,
        "p50_ms": 20.0,
        "p99_ms": 100.0,
        "batch_tasks_per_s": 10_000.0,
        "server_cpu_ms": 0.5,
        "client_cpu_ms": 0.8,
        "runs": [{}],
    }
    data = {
        "scenario": "H1",
        "submits": 2_000,
        "clients": 50,
        "batch_size": 1_000,
        "rows": {"serve-sqlite": met, "api-pg": {**met, "p99_ms": 101.0}},
    }
    assert [r.passed for r in report.read_http(Path("http-H1.json"), data)] == [True, False]


def test_h1_wrk_figures_get_a_row_of_their_own_judged_on_rate_and_p99() -> None:
    httpx = {
        "submits_per_s": 1_000.0,
        "p50_ms": 40.0,
        "p99_ms": 120.0,
        "batch_tasks_per_s": 10_000.0,
        "server_cpu_ms": 0.5,
        "client_cpu_ms": 0.5,
        "runs": [{}],
    }
    wrk = {
        "wrk_submits_per_s": 1_500.0,
        "wrk_p50_ms": 20.0,
        "wrk_p99_ms": 100.0,
        "wrk_server_cpu_ms": 0.4,
        "wrk_client_cpu_ms": 0.02,
    }
    data = {
        "scenario": "H1",
        "submits": 2_000,
        "clients": 50,
        "batch_size": 1_000,
        "rows": {"serve-sqlite": {**httpx, **wrk}, "api-pg": {**httpx, **wrk, "wrk_p99_ms": 101.0}},
    }
    rows = report.read_http(Path("http-H1.json"), data)
    assert [(("wrk" in r.scenario), r.passed) for r in rows] == [
        (False, False),
        (True, True),
        (False, False),
        (True, False),
    ]


def test_j1_pipeline_bound_adds_the_shortest_chain_before_and_after_each_resource() -> None:
    # The chain: vision 40 ms, llm 20, speech 160, llm 20, vision 40.
    assert jobs.pipeline_bound("vision", 16.0) == pytest.approx(4.0)  # first and last step
    assert jobs.pipeline_bound("llm", 8.0) == pytest.approx(0.04 + 4.0 + 0.04)
    assert jobs.pipeline_bound("speech", 32.0) == pytest.approx(0.06 + 4.0 + 0.06)


def test_j1_hand_offs_count_only_calls_that_ended_on_a_full_resource() -> None:
    # Cap 2: A and B overlap (full); A ends at 1.0 and C starts 0.1 s later. B ends full too,
    # but no call starts after it; C ends with one call in flight.
    spans = [(0.0, 1.0), (0.5, 1.5), (1.1, 2.0)]
    assert jobs.handoffs(spans, cap=2) == [pytest.approx(0.1)]
    assert jobs.handoffs([(0.0, 1.0), (2.0, 3.0)], cap=2) == []  # never full: no hand-off


def test_j1_row_is_met_only_when_every_resource_is_within_its_floor() -> None:
    def resource(ratio: float) -> dict[str, float]:
        return {"cap": 2.0, "calls": 4.0, "makespan_s": ratio, "optimum_s": 1.0, "ratio": ratio}

    figures = {"submits_per_s": 1.0, "submit_cpu_ms": 1.0, "cpu_ms_per_chain": 1.0}
    figures |= {"start_after_dependency_p50_ms": 1.0, "start_after_dependency_p99_ms": 2.0}
    data = {
        "runs": 1,
        "jobs": 2,
        "steps": 5,
        "J1": {"a": resource(1.05), "b": resource(1.2), "run": resource(1.1)},
        "J2": {"jobs": figures, "by_hand": figures},
        "J1_floor": 1.1,
        "J1_met": False,
    }
    j1, j2 = report.reader_for(data)(Path("jobs.json"), data)
    assert (j1.id, j1.passed, j2.id, j2.passed) == ("J1", False, "J2", None)
    assert "a 1.05x" in j1.figures and "b 1.2x" in j1.figures
