"""T1: 10,000 no-op tasks through the library: submitted/s and drained/s.

    python -m bench.throughput                          # SQLite, in-process worker
    python -m bench.throughput --database postgresql://postgres@127.0.0.1/test --workers 4

With --workers N the tasks are drained by N `floodway worker` processes.
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

ROOT = Path(__file__).resolve().parents[1]


async def one_run(database: str, tasks: int, workers: int, concurrency: int) -> dict[str, float]:
    fw = build(database)
    await fw.open()
    try:
        await _reset(fw)
        inputs = [{"n": i} for i in range(tasks)]
        t0 = time.perf_counter()
        # Submits as a busy API would make them: many concurrent single submits, which the
        # store commits in groups.
        await asyncio.gather(*[fw.submit("noop", v) for v in inputs])
        submit_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        if workers == 0:
            async with fw.worker(concurrency=concurrency, maintenance=False) as w:
                while w.completed < tasks:
                    await asyncio.sleep(0.01)
        else:
            procs = [_spawn(database, concurrency) for _ in range(workers)]
            try:
                while (await fw.store.stats()).by_status.get("succeeded", 0) < tasks:
                    await asyncio.sleep(0.05)
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(30)
        drain_s = time.perf_counter() - t1
        return {"submitted_per_s": tasks / submit_s, "drained_per_s": tasks / drain_s}
    finally:
        await fw.close()


async def _reset(fw: object) -> None:
    """Start from an empty ledger so runs are comparable (PostgreSQL reuses the database)."""
    store = fw.store  # type: ignore[attr-defined]
    if store.url.startswith("postgres"):
        async with store._pool.connection() as conn:  # bench only: wipe the tables
            await conn.execute("TRUNCATE tasks, task_events, fingerprints, request_keys")


def _spawn(database: str, concurrency: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FLOODWAY_DATABASE": database, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "floodway.cli", "worker", "--app", "bench.noop_app:fw",
         "--concurrency", str(concurrency)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default=None)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=0, help="worker processes (0: inline)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            database = args.database or f"sqlite:///{tmp}/bench.db"
            runs.append(asyncio.run(one_run(database, args.tasks, args.workers,
                                            args.concurrency)))
        print(f"run {i + 1}: submitted {runs[-1]['submitted_per_s']:,.0f}/s, "
              f"drained {runs[-1]['drained_per_s']:,.0f}/s")
    backend = "postgresql" if args.database and args.database.startswith("postgres") else "sqlite"
    name = f"throughput-{backend}-{args.workers or 'inline'}"
    figures = {
        "scenario": "T1",
        "backend": backend,
        "worker_processes": args.workers,
        "tasks": args.tasks,
        "runs": runs,
        "submitted_per_s": median([r["submitted_per_s"] for r in runs]),
        "drained_per_s": median([r["drained_per_s"] for r in runs]),
    }
    path = write_result(name, figures)
    print(f"median: submitted {figures['submitted_per_s']:,.0f}/s, "
          f"drained {figures['drained_per_s']:,.0f}/s -> {path}")


if __name__ == "__main__":
    main()
