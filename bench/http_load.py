"""H1: the HTTP front at the defaults: single submits from many keep-alive clients, and
batches.

    python -m bench.http_load                     # serve (SQLite) and api (PostgreSQL), 3 runs
    python -m bench.http_load --only serve-sqlite --runs 1

Each run starts the server as a deployment would, in a process of its own with no flags but a
port: ``floodway serve --config`` (API, workers and maintenance; SQLite) or ``floodway api
--config`` (API only; a fresh PostgreSQL database), with one no-op kind. Then, from this
process:

* **singles**: 50 ``httpx.AsyncClient`` (one keep-alive connection each) send 2,000
  ``POST /v1/tasks`` between them, 40 each, one after another. submits/s = 2,000 / the time
  from the first to the last answer; p50 and p99 of the requests' latencies. Each client's
  first request (opening its connection) is sent before the clock starts and not counted.
* **batches**: five ``POST /v1/batches`` of 1,000 tasks, one after another: tasks/s of each;
  the median.

The load generator runs on the same machine as the server (and its workers): they share its
cores. So each run also reports the CPU time per single submit of the server process
(``server_cpu_ms``, from /proc, workers included for ``serve``) and of this process, the
clients (``client_cpu_ms``): figures that other load on the machine does not change much, where
submits/s and latencies follow it. Writes bench/results/http-H1.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.common import median, percentile, write_result
from harness.fleet import PG_URL, free_port, fresh_database

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("serve-sqlite", "api-pg")
CONFIG = """\
database = "{database}"

[kinds.noop]
adapter = "python"
handler = "bench.noop_app:noop"
"""


def cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one by default)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@asynccontextmanager
async def server(command: str, database: str, tmp: Path) -> AsyncIterator[tuple[str, int]]:
    config = tmp / "http.toml"
    config.write_text(CONFIG.format(database=database))
    port = free_port()
    log = tmp / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "floodway.cli", command, "--config", str(config)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*args, "--port", str(port)], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base) as probe:
            for _ in range(600):
                if proc.poll() is not None:
                    raise SystemExit(f"{command} exited:\n{log.read_text(errors='replace')}")
                try:
                    if (await probe.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
            else:
                raise SystemExit(f"{command} not ready in 30 s")
        yield base, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def singles(base: str, pid: int, total: int, clients: int) -> dict[str, float]:
    latencies: list[float] = []
    counter = iter(range(10**9))
    start = asyncio.Event()

    async def post(client: httpx.AsyncClient) -> float:
        body = {"kind": "noop", "input": {"n": next(counter)}}
        t0 = time.perf_counter()
        response = await client.post("/v1/tasks", json=body)
        if response.status_code != 202:
            raise SystemExit(f"POST /v1/tasks answered {response.status_code}: {response.text}")
        return time.perf_counter() - t0

    async def one_client(ready: asyncio.Future[None]) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            await post(client)  # opens the keep-alive connection: not measured
            ready.set_result(None)
            await start.wait()
            for _ in range(total // clients):
                latencies.append(await post(client))

    ready = [asyncio.get_running_loop().create_future() for _ in range(clients)]
    jobs = [asyncio.create_task(one_client(r)) for r in ready]
    await asyncio.gather(*ready)
    server0, client0, t0 = cpu_s(pid), cpu_s(), time.perf_counter()
    start.set()
    await asyncio.gather(*jobs)
    elapsed = time.perf_counter() - t0
    n = len(latencies)
    return {
        "submits_per_s": n / elapsed,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
        "server_cpu_ms": 1000 * (cpu_s(pid) - server0) / n,
        "client_cpu_ms": 1000 * (cpu_s() - client0) / n,
    }


async def batches(base: str, size: int, count: int) -> dict[str, float]:
    rates = []
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        for b in range(count):
            body = {"tasks": [{"kind": "noop", "input": {"b": b, "n": n}} for n in range(size)]}
            t0 = time.perf_counter()
            response = await client.post("/v1/batches", json=body)
            if response.status_code != 202:
                raise SystemExit(f"POST /v1/batches answered {response.status_code}")
            rates.append(size / (time.perf_counter() - t0))
    return {"batch_tasks_per_s": median(rates)}


async def one_run(row: str, database: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if row == "serve-sqlite":
            async with server("serve", f"sqlite:///{tmp}/http.db", tmp) as (base, pid):
                return await _load(base, pid, args)
        async with fresh_database(database) as fresh, server("api", fresh, tmp) as (base, pid):
            return await _load(base, pid, args)


async def _load(base: str, pid: int, args: argparse.Namespace) -> dict[str, float]:
    figures = await singles(base, pid, args.submits, args.clients)
    figures.update(await batches(base, args.batch_size, args.batches))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=ROWS, action="append")
    parser.add_argument("--database", default=PG_URL, help="PostgreSQL server for api-pg")
    args = parser.parse_args()
    rows = args.only or list(ROWS)
    runs: dict[str, list[dict[str, float]]] = {row: [] for row in rows}
    started = time.strftime("%H:%M:%S")
    for i in range(args.runs):
        for row in rows:
            figures = asyncio.run(one_run(row, args.database, args))
            runs[row].append(figures)
            print(
                f"run {i + 1} {row:13} {figures['submits_per_s']:6,.0f} submits/s "
                f"p50 {figures['p50_ms']:5.1f} ms p99 {figures['p99_ms']:6.1f} ms, "
                f"batches {figures['batch_tasks_per_s']:7,.0f} tasks/s; CPU per submit: server "
                f"{figures['server_cpu_ms']:.2f} ms, clients {figures['client_cpu_ms']:.2f} ms"
            )
    results: dict[str, Any] = {
        row: {key: median([r[key] for r in figures]) for key in figures[0]} | {"runs": figures}
        for row, figures in runs.items()
    }
    path = write_result(
        "http-H1",
        {
            "scenario": "H1",
            "submits": args.submits,
            "clients": args.clients,
            "batch_size": args.batch_size,
            "window": f"{started}-{time.strftime('%H:%M:%S')}",
            "rows": results,
        },
    )
    print(f"\nmedians of {args.runs} -> {path}")
    for row, f in results.items():
        print(
            f"{row:13} {f['submits_per_s']:6,.0f} submits/s  p50 {f['p50_ms']:5.1f} ms  "
            f"p99 {f['p99_ms']:6.1f} ms  batches {f['batch_tasks_per_s']:7,.0f} tasks/s  "
            f"CPU/submit server {f['server_cpu_ms']:.2f} ms, clients {f['client_cpu_ms']:.2f} ms"
        )


if __name__ == "__main__":
    main()
