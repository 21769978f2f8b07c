"""C1: Q1 with the worker in its own process, SIGKILLed 3 s into the run and restarted at once.

    python -m bench.crash              # 3 runs -> bench/results/crash-C1.json
    python -m bench.crash --quick      # 100 tasks of 100 ms, killed at 0.5 s, 1 run

The simulated provider and the submitting, watching ``Floodway`` (no worker) live in this
process; the worker is ``floodway worker --app bench.apps.q1:fw`` with a 3 s lease, the very
configuration Q1 measures in-process. "3 s into the run" counts from the provider's first
request, so the kill lands mid-batch however long the interpreter takes to start. The second
worker is started the moment the first one is reaped.

Figures: lost (not terminal at the end), failed, charged twice (the simulator's ledger),
makespan from the first worker's spawn to the last task's ``finished_at`` (both start-ups
included) over the optimum (provider busy time / cap, as in Q1), and how long the provider sat
idle between the kill and the restarted worker's first request. (A request the kill cuts off
mid-body makes the simulator log a ``ClientDisconnect`` traceback: expected, and harmless.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.apps import q1 as q1app
from bench.apps.provider import KIND
from bench.quota import (
    BusyMeter,
    Figures,
    Scenario,
    Summary,
    inputs,
    makespan,
    provider_figures,
    reread,
    run_scenario,
    runtime,
    scratch_database,
    simulator,
    task_figures,
    terminal_count,
    until_terminal,
)
from floodway import Floodway
from floodway.providers.sim import RunningSimulator
from harness import processes as support

ROOT = Path(__file__).resolve().parents[1]
LEASE = "3s"


@dataclass(frozen=True)
class CrashCase:
    tasks: int
    latency_ms: float
    kill_after_s: float


def crash_case(quick: bool) -> CrashCase:
    if quick:
        return CrashCase(tasks=100, latency_ms=100.0, kill_after_s=0.5)
    return CrashCase(tasks=q1app.TASKS, latency_ms=q1app.LATENCY_MS, kill_after_s=3.0)


def start_worker(database: str, sim_url: str, log: Path) -> subprocess.Popen[bytes]:
    app = "bench.apps.q1:fw"
    concurrency = q1app.WORKER_CONCURRENCY
    return support.start_worker(app, database, sim_url, log, concurrency=concurrency, lease=LEASE)


async def until_served_exceeds(meter: BusyMeter, count: int, timeout_s: float) -> float:
    """Wait until the provider has started serving more than ``count`` requests; when it did.

    Served, not merely received: a request the killed worker was still sending reaches the
    provider's counter after the kill, but never gets served."""
    give_up = time.monotonic() + timeout_s
    while meter.served <= count:
        if time.monotonic() > give_up:
            raise TimeoutError(f"the provider served no request past #{count} in {timeout_s:g} s")
        await asyncio.sleep(0.005)
    return time.time()


def stop(worker: subprocess.Popen[bytes]) -> int:
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        return worker.wait()


async def kill_and_restart(
    fw: Floodway, sim: RunningSimulator, meter: BusyMeter, case: CrashCase, logs: Path
) -> Figures:
    """Run the batch through a worker killed mid-way and its replacement; timing figures."""
    spawned = time.time()
    first = start_worker(fw.settings.database, sim.url, logs / "worker1.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        first_request = await until_served_exceeds(meter, 0, timeout_s=60)
        await asyncio.sleep(max(0.0, first_request + case.kill_after_s - time.time()))
        running = (await fw.store.stats()).by_status.get("running", 0)
        done_before = await terminal_count(fw)
        served_at_kill = meter.served
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed = time.time()
        second = start_worker(fw.settings.database, sim.url, logs / "worker2.log")
        resumed = await until_served_exceeds(meter, served_at_kill, timeout_s=60)
        await until_terminal(fw, case.tasks, timeout_s=120 + 10 * case.tasks * 0.05)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        exit_code = stop(second) if second is not None else None
    return {
        "spawned": spawned,
        "killed_at_s": killed - spawned,
        "first_request_at_s": first_request - spawned,
        "terminal_at_kill": done_before,
        "running_at_kill": running,
        "provider_idle_after_kill_s": resumed - killed,
        "second_worker_exit": exit_code,
    }


async def c1_run(seed: int, quick: bool) -> Figures:
    case = crash_case(quick)
    sim_config = q1app.simulator(seed, case.latency_ms)
    async with simulator(sim_config) as (sim, meter), scratch_database() as database:
        logs = Path(database.removeprefix("sqlite:///")).parent
        async with runtime(q1app.settings(sim.url, database)) as fw:
            tasks = await fw.submit_many(KIND, inputs(case.tasks, f"c1-{seed}"))
            timing = await kill_and_restart(fw, sim, meter, case, logs)
            final = await reread(fw, tasks)
        provider = provider_figures(sim)
    spawned = timing.pop("spawned")
    span = makespan(final, spawned)
    optimum = meter.busy_s / q1app.CAP
    return {
        **task_figures(final),
        **provider,
        **timing,
        "makespan_s": span,
        "optimum_s": optimum,
        "makespan_over_optimum": span / optimum,
    }


def c1_check(f: Figures) -> bool:
    # The ratio is reported, not judged (BENCH.md: "report it").
    return bool(f["lost"] == 0 and f["double_charged"] == 0 and f["failed"] == 0)


C1 = Scenario(
    "C1",
    "Q1 with the worker process SIGKILLed 3 s into the run and restarted at once (lease 3 s)",
    "lost 0; charged twice 0; makespan/optimum reported",
    c1_run,
    Summary(
        (
            "makespan_over_optimum",
            "makespan_s",
            "optimum_s",
            "killed_at_s",
            "running_at_kill",
            "terminal_at_kill",
            "provider_idle_after_kill_s",
            "charged",
            "requests",
            "retries",
        ),
        ("lost", "double_charged", "failed", "rate_limited_429"),
    ),
    c1_check,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smaller, faster size")
    args = parser.parse_args()
    run_scenario(
        C1, args.runs or (1 if args.quick else 3), args.quick, prefix="crash", definitions=__doc__
    )


if __name__ == "__main__":
    main()
