"""Crash scenarios: a worker process SIGKILLed mid-batch and a new one started at once.

    python -m bench.crash                     # C1 (3 runs), C2 (5 per ledger), C3 (5 runs)
    python -m bench.crash --scenario C2       # one of them
    python -m bench.crash --quick             # smaller sizes, 1 run each

C1: Q1 with the worker in its own process, SIGKILLed 3 s into the run and restarted at once.
The simulated provider and the submitting, watching ``Floodway`` (no worker) live in this
process; the worker is ``floodway worker --app bench.apps.q1:fw`` at its default lease, the
very configuration Q1 measures in-process. "3 s into the run" counts from the provider's
first request, so the kill lands mid-batch however long the interpreter takes to start. The
second worker is started the moment the first one is reaped. Figures: lost (not terminal at
the end), failed, charged twice (the simulator's ledger), makespan from the first worker's
spawn to the last task's ``finished_at`` (both start-ups included) over the optimum (provider
busy time / cap, as in Q1), and how long the provider sat idle between the kill and the
restarted worker's first request.

C2: recovery time. 20 calls of 4 s against a cap of 10, on SQLite and on PostgreSQL; the
worker (default lease, 30 s) is SIGKILLed once 10 calls are in flight and a new one is started
at once. Figure: seconds from the kill until every task the dead worker held is running again
under the new worker, or terminal. floodway sees the death itself (the dead process's
liveness lock is free), so this does not wait for the lease.

C3: C1 against a provider that ignores Idempotency-Key and has no look-up (the simulator with
``honor_idempotency_key = false``; the kind at floodway's default timeout, 60 s), SIGKILLed 3 s
into the run and restarted at once. The calls the dead worker left can be neither resent nor
looked up: their tasks fail ``interrupted`` and their slots are held until the calls could
have ended, bounded by what the kind's calls have taken (core/hangup.py), not the timeout.
Figures: ``settled_s``, seconds from the kill until every task the dead worker held has ended
and the provider runs at its cap again (or has nothing left to run), and ``restarted_s``, the part
of it the new worker took to start (the kill until its first call was served); the provider's
peak; lost;
charged twice (the simulator's ledger counts charges per key, honoured or not).

(A request the kill cuts off mid-body makes the simulator log a ``ClientDisconnect``
traceback: expected, and harmless.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.apps import q1 as q1app
from bench.apps.provider import KIND
from bench.quota import (
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
from harness.fleet import fresh_database

ROOT = Path(__file__).resolve().parents[1]
APP = "bench.apps.q1:fw"


@dataclass(frozen=True)
class CrashCase:
    tasks: int
    latency_ms: float
    kill_after_s: float


def crash_case(quick: bool) -> CrashCase:
    if quick:
        return CrashCase(tasks=100, latency_ms=100.0, kill_after_s=0.5)
    return CrashCase(tasks=q1app.TASKS, latency_ms=q1app.LATENCY_MS, kill_after_s=3.0)


def start_worker(database: str, sim_url: str, log: Path, app: str = APP) -> subprocess.Popen[bytes]:
    """A ``floodway worker`` at its default lease."""
    concurrency = q1app.WORKER_CONCURRENCY
    return support.start_worker(app, database, sim_url, log, concurrency=concurrency, lease=None)


async def until_served_exceeds(sim: RunningSimulator, count: int, timeout_s: float) -> float:
    """Wait until the provider has started serving more than ``count`` requests; when it did.

    Served, not merely received: a request the killed worker was still sending reaches the
    provider's counter after the kill, but never gets served."""
    give_up = time.monotonic() + timeout_s
    while sim.state.stats.served <= count:
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


def reap(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.kill()
        worker.wait()


# -- C1: a kill mid-batch ----------------------------------------------------------------------
async def kill_and_restart(
    fw: Floodway, sim: RunningSimulator, case: CrashCase, logs: Path
) -> Figures:
    """Run the batch through a worker killed mid-way and its replacement; timing figures."""
    spawned = time.time()
    first = start_worker(fw.settings.database, sim.url, logs / "worker1.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        first_request = await until_served_exceeds(sim, 0, timeout_s=60)
        await asyncio.sleep(max(0.0, first_request + case.kill_after_s - time.time()))
        running = (await fw.store.stats()).by_status.get("running", 0)
        done_before = await terminal_count(fw)
        served_at_kill = sim.state.stats.served
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed = time.time()
        second = start_worker(fw.settings.database, sim.url, logs / "worker2.log")
        resumed = await until_served_exceeds(sim, served_at_kill, timeout_s=60)
        await until_terminal(fw, case.tasks, timeout_s=120 + 10 * case.tasks * 0.05)
    finally:
        reap(first)
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
    async with simulator(sim_config) as sim, scratch_database() as database:
        logs = Path(database.removeprefix("sqlite:///")).parent
        async with runtime(q1app.settings(sim.url, database)) as fw:
            tasks = await fw.submit_many(KIND, inputs(case.tasks, f"c1-{seed}"))
            timing = await kill_and_restart(fw, sim, case, logs)
            final = await reread(fw, tasks)
        provider = provider_figures(sim)
    spawned = timing.pop("spawned")
    span = makespan(final, spawned)
    optimum = sim.state.stats.busy_s / q1app.CAP
    return {
        **task_figures(final),
        **provider,
        **timing,
        "makespan_s": span,
        "optimum_s": optimum,
        "makespan_over_optimum": span / optimum,
    }


def c1_check(f: Figures) -> bool:
    # The ratio is reported, not judged: a kill costs what the restart costs.
    return bool(f["lost"] == 0 and f["double_charged"] == 0 and f["failed"] == 0)


C1 = Scenario(
    "C1",
    "Q1 with the worker process SIGKILLed 3 s into the run and restarted at once",
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


# -- C3: the kill, against a provider without keys ----------------------------------------------
APP_WITHOUT_KEYS = "bench.apps.q1:fw_without_keys"


async def c3_run(seed: int, quick: bool) -> Figures:
    case = crash_case(quick)
    sim_config = q1app.simulator(seed, case.latency_ms)
    sim_config = sim_config.model_copy(update={"honor_idempotency_key": False})
    async with simulator(sim_config) as sim, scratch_database() as database:
        logs = Path(database.removeprefix("sqlite:///")).parent
        async with runtime(q1app.settings(sim.url, database, keys=False)) as fw:
            tasks = await fw.submit_many(KIND, inputs(case.tasks, f"c3-{seed}"))
            first = start_worker(database, sim.url, logs / "worker1.log", APP_WITHOUT_KEYS)
            second: subprocess.Popen[bytes] | None = None
            try:
                started = await until_served_exceeds(sim, 0, timeout_s=60)
                await asyncio.sleep(max(0.0, started + case.kill_after_s - time.time()))
                served_at_kill = sim.state.stats.served
                os.kill(first.pid, signal.SIGKILL)
                first.wait()
                killed = time.monotonic()
                held = [t.id for t in await reread(fw, tasks) if t.status.value == "running"]
                second = start_worker(database, sim.url, logs / "worker2.log", APP_WITHOUT_KEYS)
                await until_served_exceeds(sim, served_at_kill, timeout_s=60)
                restarted = time.monotonic()
                settled = await until_settled(fw, sim, held, case.tasks, timeout_s=120)
                await until_terminal(fw, case.tasks, timeout_s=180)
            finally:
                reap(first)
                if second is not None:
                    stop(second)
            final = await reread(fw, tasks)
        provider = provider_figures(sim)
    return {
        "settled_s": settled - killed,
        # of which the new worker's start-up: the kill until its first call was served
        "restarted_s": restarted - killed,
        "held_at_kill": len(held),
        **task_figures(final),
        "interrupted": sum(
            t.error is not None and t.error.cls.value == "interrupted" for t in final
        ),
        **provider,
    }


async def until_settled(
    fw: Floodway, sim: RunningSimulator, held: list[str], total: int, timeout_s: float
) -> float:
    """Wait until every task in ``held`` has ended and the provider runs at its cap again (or
    every task has ended); when (monotonic)."""
    give_up = time.monotonic() + timeout_s
    waiting = set(held)
    while True:
        for task_id in list(waiting):
            if (await fw.get(task_id)).terminal:
                waiting.discard(task_id)
        full = sim.state.stats.in_flight >= q1app.CAP
        if not waiting and (full or await terminal_count(fw) >= total):
            return time.monotonic()
        if time.monotonic() > give_up:
            raise TimeoutError(f"not settled after {timeout_s:g} s ({len(waiting)} held)")
        await asyncio.sleep(0.01)


def c3_check(f: Figures) -> bool:
    return bool(
        f["settled_s"] <= 4.0
        and f["peak_concurrency"] <= q1app.CAP
        and f["rate_limited_429"] == 0
        and f["lost"] == 0
        and f["double_charged"] == 0
    )


C3 = Scenario(
    "C3",
    "C1 against a provider without keys nor look-up (default timeout, 60 s): the worker "
    "SIGKILLed 3 s in, restarted at once",
    "settled <= 4 s after the kill; provider peak <= cap; lost 0; charged twice 0",
    c3_run,
    Summary(
        ("settled_s", "restarted_s", "held_at_kill", "interrupted", "peak_concurrency", "charged"),
        ("lost", "double_charged", "rate_limited_429"),
    ),
    c3_check,
)


# -- C2: how soon a dead worker's tasks move on ------------------------------------------------
C2_TASKS = 20
C2_LATENCY_MS = 4000.0


async def recovery_run(database: str, seed: int, quick: bool, logs: Path) -> Figures:
    latency_ms = 1500.0 if quick else C2_LATENCY_MS
    sim_config = q1app.simulator(seed, latency_ms).model_copy(update={"error_rate": 0.0})
    async with simulator(sim_config) as sim:
        async with runtime(q1app.settings(sim.url, database)) as fw:
            tasks = await fw.submit_many(KIND, inputs(C2_TASKS, f"c2-{seed}"))
            first = start_worker(database, sim.url, logs / "worker1.log")
            second: subprocess.Popen[bytes] | None = None
            try:
                await until_in_flight(sim, q1app.CAP, timeout_s=60)
                held = {t.id: t.lease_token for t in await reread(fw, tasks) if t.lease_token}
                os.kill(first.pid, signal.SIGKILL)
                first.wait()
                killed = time.monotonic()
                second = start_worker(database, sim.url, logs / "worker2.log")
                settled = await until_moved_on(fw, held, timeout_s=120)
                await until_terminal(fw, C2_TASKS, timeout_s=120)
            finally:
                reap(first)
                if second is not None:
                    stop(second)
            final = await reread(fw, tasks)
        provider = provider_figures(sim)
    return {
        "recovery_s": settled - killed,
        "held_at_kill": len(held),
        **task_figures(final),
        **provider,
    }


async def until_in_flight(sim: RunningSimulator, count: int, timeout_s: float) -> None:
    give_up = time.monotonic() + timeout_s
    while sim.state.stats.in_flight < count:
        if time.monotonic() > give_up:
            raise TimeoutError(f"fewer than {count} calls in flight after {timeout_s:g} s")
        await asyncio.sleep(0.005)


async def until_moved_on(fw: Floodway, held: dict[str, str], timeout_s: float) -> float:
    """Wait until each task the dead worker held is terminal or runs under a new lease; when."""
    give_up = time.monotonic() + timeout_s
    waiting = dict(held)
    while waiting:
        for task_id, token in list(waiting.items()):
            task = await fw.get(task_id)
            if task.terminal or (task.status.value == "running" and task.lease_token != token):
                del waiting[task_id]
        if time.monotonic() > give_up:
            raise TimeoutError(f"{len(waiting)} tasks still held by the dead worker")
        await asyncio.sleep(0.01)
    return time.monotonic()


async def c2_sqlite(seed: int, quick: bool) -> Figures:
    async with scratch_database() as database:
        logs = Path(database.removeprefix("sqlite:///")).parent
        return await recovery_run(database, seed, quick, logs)


async def c2_postgres(seed: int, quick: bool) -> Figures:
    with tempfile.TemporaryDirectory(prefix="floodway-bench-") as tmp:
        async with fresh_database() as database:
            return await recovery_run(database, seed, quick, Path(tmp))


def c2_check(f: Figures) -> bool:
    return bool(
        f["recovery_s"] <= 2.0 and f["lost"] == 0 and f["double_charged"] == 0 and f["failed"] == 0
    )


def c2(ledger: str, run: Callable[[int, bool], Coroutine[Any, Any, Figures]]) -> Scenario:
    return Scenario(
        f"C2-{ledger.lower()}",
        f"{ledger}: a worker SIGKILLed with 10 calls in flight (default lease), a new one "
        "started at once: seconds until each of its tasks runs again or ended",
        "recovery <= 2 s; lost 0; charged twice 0",
        run,
        Summary(
            ("recovery_s", "held_at_kill", "charged", "requests"),
            ("lost", "double_charged", "failed"),
        ),
        c2_check,
    )


SCENARIOS = {
    "C1": [(C1, 3)],
    "C2": [(c2("SQLite", c2_sqlite), 5), (c2("PostgreSQL", c2_postgres), 5)],
    "C3": [(C3, 5)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    parser.add_argument("--runs", type=int, default=None, help="default 3 for C1, 5 for C2 and C3")
    parser.add_argument("--quick", action="store_true", help="smaller, faster size, 1 run")
    args = parser.parse_args()
    for name in args.scenario or sorted(SCENARIOS):
        for scenario, runs in SCENARIOS[name]:
            count = args.runs or (1 if args.quick else runs)
            run_scenario(scenario, count, args.quick, prefix="crash", definitions=__doc__)


if __name__ == "__main__":
    main()
