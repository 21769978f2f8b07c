"""T3: a cross-process drain at the defaults, floodway beside Dramatiq in the same run.

    python -m bench.peers                         # every row, medians of 3
    python -m bench.peers --only sqlite --runs 1  # one row: sqlite, pg-1, pg-4 or dramatiq

Each row: another process submits 10,000 no-op tasks and the queue's own worker process(es),
started with no flags, drain them:

* floodway: ``floodway worker --config peers.toml`` (one kind, ``adapter = "python"``, a no-op
  handler; nothing else configured) on SQLite, and on PostgreSQL with 1 and 4 processes. The
  workers start first, on the empty ledger; once every one is up, the other process submits
  the 10,000 as one batch (one transaction), so every worker process sees them at once (with
  4 processes started after the submit, the last ones would still be importing Python, on
  the same 2 cores, while the first drains).
* Dramatiq: ``dramatiq --processes 1 bench.peer_dramatiq`` (one process, its default 8
  threads) on a private ``redis-server``, started once the 10,000 messages are enqueued (it
  enqueues one message at a time: a worker already running would drain beside the enqueue).

Both are measured the same way, from outside: this process counts what is done every 10 ms
(floodway: rows succeeded in the ledger; Dramatiq: messages acknowledged in Redis), and
drained/s is the tasks done between the first count that shows progress and the count that
shows none left, over that time (so neither includes a start-up). floodway's
``ledger_drained_per_s`` is the same on the ledger's own clock (first claim to last finish).
Once drained, this process submits 20 more, one every 100 ms, to the idle workers:
``pickup_p50_ms`` and ``pickup_max_ms`` are how long one waited to start (``started_at -
created_at``: another process's submit reaching a waiting worker).
The machine may be loaded by other work: compare rows of one run, not runs of different days.
Writes bench/results/peers-T3.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.common import median, write_result
from bench.peer_dramatiq import PENDING_KEY
from floodway import Floodway
from harness.fleet import PG_URL, fresh_database, private_redis

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("sqlite", "pg-1", "pg-4", "dramatiq")
POLL_S = 0.01
PICKUPS = 20
CONFIG = """\
database = "{database}"

[kinds.noop]
adapter = "python"
handler = "bench.noop_app:noop"
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "FLOODWAY_LOG_LEVEL": "warning"}


def _run_module(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )


def _submit(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Submit from a process of its own, as a real deployment's clients would."""
    return _run_module(["bench.peers", "submit", *args], log, env)


def _submitted(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.wait(300) != 0:
        raise SystemExit(f"submitting failed:\n{log.read_text(errors='replace')[-2000:]}")


@contextmanager
def _processes(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _drain(
    procs: list[subprocess.Popen[bytes]], done: Callable[[], int], tasks: int, log: Path
) -> dict[str, float]:
    """Watch ``done()`` until it is ``tasks``: the drain rate from the first count that shows
    progress (what was left then) to the end."""
    began = time.perf_counter()
    first: tuple[float, int] | None = None
    while True:
        now, finished = time.perf_counter(), done()
        remaining = tasks - finished
        if first is None and finished > 0:
            first = (now, remaining)
        if remaining == 0:
            break
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a worker exited:\n{log.read_text(errors='replace')[-2000:]}")
        if now - began > 600:
            raise SystemExit(f"not drained in 600 s ({remaining} left)")
        time.sleep(POLL_S)
    assert first is not None
    return {"drained_per_s": first[1] / max(now - first[0], POLL_S)}


def _until_up(procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    """Until every worker process has printed its start-up line."""
    deadline = time.perf_counter() + 120
    while not all("running noop" in log.read_text(errors="replace") for log in logs):
        for p, log in zip(procs, logs, strict=True):
            if p.poll() is not None:
                raise SystemExit(f"a worker exited:\n{log.read_text(errors='replace')[-2000:]}")
        if time.perf_counter() > deadline:
            raise SystemExit("the workers did not start within 120 s")
        time.sleep(0.05)


def _floodway_row(database: str, workers: int, tasks: int, tmp: Path) -> dict[str, float]:
    config = tmp / "peers.toml"
    config.write_text(CONFIG.format(database=database))
    env = _env()
    logs = [tmp / f"worker-{i}.log" for i in range(workers)]
    procs = [
        _run_module(["floodway.cli", "worker", "--config", str(config)], log, env) for log in logs
    ]
    count = "SELECT count(*) FROM tasks WHERE status = 'succeeded'"
    window = "SELECT min(started_at), max(finished_at) FROM tasks"
    with _processes(procs):
        _until_up(procs, logs)  # the ledger exists and is migrated from here on
        if database.startswith("sqlite"):
            conn: Any = sqlite3.connect(database.removeprefix("sqlite:///"))
        else:
            conn = psycopg.connect(database, autocommit=True)
        try:
            # Watched from before the batch lands, not from when its process has exited.
            submit = _submit(["floodway", str(config), str(tasks)], tmp / "submit.log", env)
            figures = _drain(procs, lambda: int(conn.execute(count).fetchone()[0]), tasks, logs[0])
            _submitted(submit, tmp / "submit.log")
            first_claim, last_finish = conn.execute(window).fetchone()
            figures["ledger_drained_per_s"] = tasks / (last_finish - first_claim)
            waits = asyncio.run(_pickups(config))
            figures["pickup_p50_ms"] = 1000 * median(waits)
            figures["pickup_max_ms"] = 1000 * max(waits)
            return figures
        finally:
            conn.close()


async def _pickups(config: Path) -> list[float]:
    """Single submits to idle workers: how long each waited to start."""
    async with Floodway(config=str(config)) as fw:
        ids = []
        for n in range(PICKUPS):
            ids.append((await fw.submit("noop", {"pickup": n})).id)
            await asyncio.sleep(0.1)
        done = [await fw.wait(task_id, timeout=30) for task_id in ids]
    return [(t.started_at or t.created_at) - t.created_at for t in done]


async def _dramatiq_row(tasks: int, tmp: Path) -> dict[str, float]:
    async with private_redis(tmp / "redis") as server:
        env = {**_env(), "DRAMATIQ_REDIS": server.url}
        log = tmp / "dramatiq.log"
        _submitted(_submit(["dramatiq", server.url, str(tasks)], log, env), log)
        client = redis.Redis.from_url(server.url)
        worker = _run_module(["dramatiq", "--processes", "1", "bench.peer_dramatiq"], log, env)
        try:
            with _processes([worker]):
                return await asyncio.to_thread(
                    _drain, [worker], lambda: tasks - int(client.hlen(PENDING_KEY)), tasks, log
                )
        finally:
            client.close()


async def one_run(row: str, tasks: int, database: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if row == "dramatiq":
            return await _dramatiq_row(tasks, tmp)
        if row == "sqlite":
            return await asyncio.to_thread(
                _floodway_row, f"sqlite:///{tmp}/peers.db", 1, tasks, tmp
            )
        async with fresh_database(database) as fresh:
            workers = int(row.removeprefix("pg-"))
            return await asyncio.to_thread(_floodway_row, fresh, workers, tasks, tmp)


# -- the submitting process -------------------------------------------------------------------
async def submit_floodway(config: str, tasks: int) -> None:
    async with Floodway(config=config) as fw:
        await fw.submit_many("noop", [{"n": n} for n in range(tasks)])


def submit_dramatiq(tasks: int) -> None:
    from bench.peer_dramatiq import noop

    for n in range(tasks):
        noop.send(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    submit = sub.add_parser("submit", help="(internal) the submitting process")
    submit.add_argument("queue", choices=("floodway", "dramatiq"))
    submit.add_argument("target", help="floodway: the config file; dramatiq: the Redis URL")
    submit.add_argument("tasks", type=int)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=ROWS, action="append")
    parser.add_argument("--database", default=PG_URL, help="PostgreSQL server for pg-N rows")
    args = parser.parse_args()
    if args.command == "submit":
        if args.queue == "floodway":
            asyncio.run(submit_floodway(args.target, args.tasks))
        else:
            submit_dramatiq(args.tasks)
        return
    rows = args.only or list(ROWS)
    runs: dict[str, list[dict[str, float]]] = {row: [] for row in rows}
    started = time.strftime("%H:%M:%S")
    for i in range(args.runs):  # rows interleaved: each run sees the machine as the others do
        for row in rows:
            runs[row].append(asyncio.run(one_run(row, args.tasks, args.database)))
            print(f"run {i + 1} {row:9} drained {runs[row][-1]['drained_per_s']:,.0f}/s")
    results: dict[str, Any] = {}
    for row, figures in runs.items():
        results[row] = {
            key: median([r[key] for r in figures]) for key in figures[0] if key != "runs"
        } | {"runs": figures}
    write_result(
        "peers-T3",
        {
            "scenario": "T3",
            "tasks": args.tasks,
            "window": f"{started}-{time.strftime('%H:%M:%S')}",
            "rows": results,
        },
    )
    print(f"\n{'row':10}{'drained/s':>12}{'pickup p50/max ms':>20}")
    for row, figures in results.items():
        pickup = (
            f"{figures['pickup_p50_ms']:.0f}/{figures['pickup_max_ms']:.0f}"
            if "pickup_p50_ms" in figures
            else ""
        )
        print(f"{row:10}{figures['drained_per_s']:>12,.0f}{pickup:>20}")
    if "dramatiq" in results:
        base = results["dramatiq"]["drained_per_s"]
        for row in results.keys() - {"dramatiq"}:
            print(f"{row}: {results[row]['drained_per_s'] / base:.2f}x Dramatiq")


if __name__ == "__main__":
    main()
