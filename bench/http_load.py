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
* **wrk**: the singles' load again from a compiled client, so that the figure is the server's
  rather than the Python clients': ``wrk`` (Debian: ``apt-get install wrk``) with 50
  keep-alive connections on 2 threads posts the same bodies for ``--wrk-seconds`` (wrk runs for
  a time, not a count): submits/s, p50 and p99 (its ``--latency`` histogram), the server's CPU
  per submit and wrk's own (``wrk_client_cpu_ms``). Any answer but 202 stops the bench. Without
  wrk on the PATH these figures are left out and the bench says so.

The load generator runs on the same machine as the server (and its workers): they share its
cores. So each run also reports the CPU time per single submit of the server process
(``server_cpu_ms``, from /proc, workers included for ``serve``) and of this process, the
clients (``client_cpu_ms``): figures that other load on the machine does not change much, where
submits/s and latencies follow it. Writes bench/results/http-H1.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
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
WRK_THREADS = 2
#: wrk's Lua: each thread posts the singles' bodies, with inputs distinct from theirs and from
#: each other's (the same input again would be the same work: a dedup, another path), counts
#: any answer but 202, and at the end prints one JSON line of its figures.
WRK_SCRIPT = """\
local threads = {}
counter, wrong = 0, 0  -- globals of each thread: done() reads "wrong" from them
function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end
function init(args)
  headers = {["Content-Type"] = "application/json"}
end
function request()
  counter = counter + 1
  local body = string.format('{"kind":"noop","input":{"n":%d}}', 1e9 + counter * 1000 + id)
  return wrk.format("POST", "/v1/tasks", headers, body)
end
function response(status, headers, body)
  if status ~= 202 then wrong = wrong + 1 end
end
function done(summary, latency, requests)
  local wrong_total = 0
  for _, thread in ipairs(threads) do wrong_total = wrong_total + thread:get("wrong") end
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"not_202":%d,"socket_errors":%d,"p50_us":%d,"p99_us":%d}\\n',
    summary.requests, summary.duration, wrong_total,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""
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


def wrk_missing() -> str | None:
    """Why the wrk figures cannot be measured here, or None."""
    if shutil.which("wrk") is None:
        return "wrk is not installed (Debian: apt-get install wrk): wrk figures left out"
    return None


def wrk_singles(base: str, pid: int, seconds: float, connections: int) -> dict[str, float]:
    """The singles from wrk for ``seconds``: rate, latencies and CPU per submit."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(WRK_SCRIPT)
        script.flush()
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        server0 = cpu_s(pid)
        run = subprocess.run(
            [
                *("wrk", f"-t{WRK_THREADS}", f"-c{connections}", f"-d{seconds:g}s"),
                *("--latency", "-s", script.name, base),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        server = cpu_s(pid) - server0
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary_line = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    if run.returncode != 0 or not summary_line.startswith("{"):
        raise SystemExit(f"wrk failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    summary = json.loads(summary_line)
    if summary["not_202"] or summary["socket_errors"]:
        raise SystemExit(f"wrk: answers other than 202 or socket errors: {summary}")
    n = summary["requests"]
    client = (children.ru_utime + children.ru_stime) - (children0.ru_utime + children0.ru_stime)
    return {
        "wrk_submits_per_s": n / (summary["duration_us"] / 1e6),
        "wrk_p50_ms": summary["p50_us"] / 1000,
        "wrk_p99_ms": summary["p99_us"] / 1000,
        "wrk_server_cpu_ms": 1000 * server / n,
        "wrk_client_cpu_ms": 1000 * client / n,
    }


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
    if args.wrk_seconds > 0 and wrk_missing() is None:
        figures.update(
            await asyncio.to_thread(wrk_singles, base, pid, args.wrk_seconds, args.clients)
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--wrk-seconds", type=float, default=4.0, help="how long wrk posts singles (0: no wrk)"
    )
    parser.add_argument("--only", choices=ROWS, action="append")
    parser.add_argument("--database", default=PG_URL, help="PostgreSQL server for api-pg")
    args = parser.parse_args()
    rows = args.only or list(ROWS)
    if args.wrk_seconds > 0 and (missing := wrk_missing()) is not None:
        print(missing)
    runs: dict[str, list[dict[str, float]]] = {row: [] for row in rows}
    started = time.strftime("%H:%M:%S")
    for i in range(args.runs):
        for row in rows:
            figures = asyncio.run(one_run(row, args.database, args))
            runs[row].append(figures)
            print(f"run {i + 1} {row:13} {summary(figures)}")
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
        print(f"{row:13} {summary(f)}")


def summary(f: dict[str, Any]) -> str:
    text = (
        f"httpx {f['submits_per_s']:6,.0f} submits/s p50 {f['p50_ms']:5.1f} ms "
        f"p99 {f['p99_ms']:6.1f} ms, CPU per submit: server {f['server_cpu_ms']:.2f} ms, "
        f"clients {f['client_cpu_ms']:.2f} ms; batches {f['batch_tasks_per_s']:7,.0f} tasks/s"
    )
    if "wrk_submits_per_s" in f:
        text += (
            f"; wrk {f['wrk_submits_per_s']:6,.0f} submits/s p50 {f['wrk_p50_ms']:5.1f} ms "
            f"p99 {f['wrk_p99_ms']:6.1f} ms, CPU per submit: server "
            f"{f['wrk_server_cpu_ms']:.2f} ms, wrk {f['wrk_client_cpu_ms']:.2f} ms"
        )
    return text


if __name__ == "__main__":
    main()
