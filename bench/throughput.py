"""T1: 10,000 no-op tasks through the library: submitted/s and drained/s.

    python -m bench.throughput                          # SQLite, in-process worker
    python -m bench.throughput --database postgresql://postgres@127.0.0.1/test --workers 4
    python -m bench.throughput --keyed ...              # every submit with a request key
    python -m bench.throughput --budgeted ...           # a priced kind, every tenant a budget

With --workers N the tasks are drained by N `floodway worker` processes, started once the
tasks are submitted; drained/s is then measured on the ledger's own clock, from the first claim
to the last finish, so the processes' start-up (Python imports, connecting) is not counted.

PostgreSQL: each run uses a fresh database created on the server of --database (and dropped
after), so the database you name is never written to, and concurrent runs cannot collide. At
most --submit-concurrency submits are in flight at once (an API's worth of concurrent requests):
the store has one pool of 10 connections, and 10,000 simultaneous submits would wait in its
queue past its 10 s timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import median, write_result
from bench.noop_app import build
from floodway import Floodway, Status
from floodway.store.base import TaskQuery
from harness.fleet import fresh_database

ROOT = Path(__file__).resolve().parents[1]


async def one_run(
    database: str,
    tasks: int,
    workers: int,
    concurrency: int,
    submit_concurrency: int,
    keyed: bool = False,
    budgeted: bool = False,
) -> dict[str, float]:
    if database.startswith("postgres"):
        async with fresh_database(database) as fresh:
            return await _measure(
                fresh, tasks, workers, concurrency, submit_concurrency, keyed, budgeted
            )
    return await _measure(database, tasks, workers, concurrency, 0, keyed, budgeted)


async def _measure(
    database: str,
    tasks: int,
    workers: int,
    concurrency: int,
    submit_concurrency: int,
    keyed: bool,
    budgeted: bool,
) -> dict[str, float]:
    fw = build(database, budgeted=budgeted)
    await fw.open()
    try:
        inputs = [{"n": i} for i in range(tasks)]
        gate = asyncio.Semaphore(submit_concurrency)

        async def submit(value: dict[str, int]) -> None:
            # --keyed: each submit carries its own request key, as an API's clients would send
            await fw.submit("noop", value, key=f"k{value['n']}" if keyed else None)

        async def bounded_submit(value: dict[str, int]) -> None:
            async with gate:
                await submit(value)

        t0 = time.perf_counter()
        # Submits as a busy API would make them: many concurrent single submits, which the
        # store commits in groups.
        if submit_concurrency:
            await asyncio.gather(*[bounded_submit(v) for v in inputs])
        else:
            await asyncio.gather(*[submit(v) for v in inputs])
        submit_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        if workers == 0:
            async with fw.worker(concurrency=concurrency, maintenance=False) as w:
                while w.completed < tasks:
                    await asyncio.sleep(0.01)
        else:
            with tempfile.TemporaryDirectory() as logs:
                procs = [
                    _spawn(database, concurrency, Path(logs) / f"w{i}.log", budgeted)
                    for i in range(workers)
                ]
                try:
                    while (await fw.store.stats()).by_status.get("succeeded", 0) < tasks:
                        _check_alive(procs, Path(logs))
                        await asyncio.sleep(0.05)
                finally:
                    for p in procs:
                        p.terminate()
                    for p in procs:
                        p.wait(30)
        wall_s = time.perf_counter() - t1
        figures = {"submitted_per_s": tasks / submit_s, "drained_per_s": tasks / wall_s}
        if workers:
            first_claim, last_finish = await _ledger_window(fw)
            figures["drained_per_s"] = tasks / (last_finish - first_claim)
            figures["drained_per_s_with_startup"] = tasks / wall_s
        return figures
    finally:
        await fw.close()


async def _ledger_window(fw: Floodway) -> tuple[float, float]:
    """First claim and last finish, as the workers wrote them (one host, one clock)."""
    first, last = float("inf"), float("-inf")
    after = 0
    while True:
        page = await fw.list_tasks(TaskQuery(status=Status.SUCCEEDED, after_seq=after, limit=1000))
        if not page:
            return first, last
        for t in page:
            first = min(first, t.started_at or first)
            last = max(last, t.finished_at or last)
        after = page[-1].seq


def _spawn(database: str, concurrency: int, log: Path, budgeted: bool) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FLOODWAY_DATABASE": database, "PYTHONPATH": str(ROOT)}
    env["FLOODWAY_BENCH_BUDGETED"] = "1" if budgeted else "0"
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "floodway.cli",
                "worker",
                "--app",
                "bench.noop_app:fw",
                "--concurrency",
                str(concurrency),
            ],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _check_alive(procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    """A worker that died would leave the drain waiting forever: stop with its output."""
    for i, p in enumerate(procs):
        if p.poll() is not None:
            output = (logs / f"w{i}.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"worker process {i} exited with {p.returncode}:\n{output}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default=None)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=0, help="worker processes (0: inline)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--submit-concurrency", type=int, default=64, help="PostgreSQL: submits in flight at once"
    )
    parser.add_argument("--keyed", action="store_true", help="every submit has a request key")
    parser.add_argument(
        "--budgeted", action="store_true", help="a priced kind and a budget for every tenant"
    )
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            database = args.database or f"sqlite:///{tmp}/bench.db"
            runs.append(
                asyncio.run(
                    one_run(
                        database,
                        args.tasks,
                        args.workers,
                        args.concurrency,
                        args.submit_concurrency,
                        args.keyed,
                        args.budgeted,
                    )
                )
            )
        print(
            f"run {i + 1}: submitted {runs[-1]['submitted_per_s']:,.0f}/s, "
            f"drained {runs[-1]['drained_per_s']:,.0f}/s"
        )
    backend = "postgresql" if args.database and args.database.startswith("postgres") else "sqlite"
    name = f"throughput-{backend}-{args.workers or 'inline'}" + ("-keyed" if args.keyed else "")
    name += "-budgeted" if args.budgeted else ""
    figures = {
        "scenario": "T1",
        "backend": backend,
        "keyed": args.keyed,
        "budgeted": args.budgeted,
        "worker_processes": args.workers,
        "tasks": args.tasks,
        "runs": runs,
        "submitted_per_s": median([r["submitted_per_s"] for r in runs]),
        "drained_per_s": median([r["drained_per_s"] for r in runs]),
    }
    path = write_result(name, figures)
    print(
        f"median: submitted {figures['submitted_per_s']:,.0f}/s, "
        f"drained {figures['drained_per_s']:,.0f}/s -> {path}"
    )


if __name__ == "__main__":
    main()
