"""O4: what the OpenAI-compatible front adds, measured from outside: chat requests from
``wrk`` straight to an OpenAI-compatible provider and through ``floodway serve``'s
``/openai/v1`` (SQLite ledger, the resource's limits, a price and a tenant budget on), one at
a time and 64 at once, and the same through the LiteLLM proxy when one is installed.

    python -m bench.openai_gateway                 # writes bench/results/openai-O4.json
    python -m bench.openai_gateway --quick         # shorter runs, -quick file
    python -m bench.openai_gateway --floodway-src DIR   # floodway from another tree (a baseline)
    python -m bench.openai_gateway --litellm /path/to/venv/bin/litellm

The provider is ``floodway simulate --openai --latency-ms 0`` (it answers at once), its own
process; floodway and LiteLLM are processes of their own; all share the machine with wrk. Every
request's body is distinct (a counter in the prompt), so floodway's dedupe shares nothing.
Figures: requests/s, p50 and p99 of wrk's latency, and what floodway adds to the provider's
p50 and p99 one at a time; then the time to a stream's first event (``stream: true``, one at a
time, from httpx: the same client on both paths, so the difference is floodway's), p50 and
p99. Without wrk on the PATH the bench says so and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.common import percentile, write_result
from bench.http_load import cpu_s
from harness.fleet import free_port
from harness.processes import ROOT, until

KEY = "bench-key"
MODEL = "gpt-4o-mini"
CONCURRENT = 64
STREAMS = 200  # streams one at a time, after 20 to warm up
#: wrk's Lua: POST a chat request with a prompt no other request has, count any answer but
#: 200, and print one JSON line of the figures at the end
WRK_SCRIPT = """\
local threads = {}
counter, wrong = 0, 0
function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end
function init(args)
  path = args[1]
  headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer %(key)s"}
end
function request()
  counter = counter + 1
  local body = string.format(
    '{"model":"%(model)s","messages":[{"role":"user","content":"question %%d of %%d"}]}',
    counter, id)
  return wrk.format("POST", path, headers, body)
end
function response(status, headers, body)
  if status ~= 200 then wrong = wrong + 1 end
end
function done(summary, latency, requests)
  local wrong_total = 0
  for _, thread in ipairs(threads) do wrong_total = wrong_total + thread:get("wrong") end
  io.write(string.format(
    '{"requests":%%d,"duration_us":%%d,"not_200":%%d,"socket_errors":%%d,"p50_us":%%d,"p99_us":%%d}\\n',
    summary.requests, summary.duration, wrong_total,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""
FLOODWAY_CONFIG = """\
database = "sqlite:///{folder}/gateway.db"

[api]
keys = {{ "{key}" = "bench" }}

[tenants]
budget = {{ amount = 1000000.0, period = "1d" }}

[resources.openai]
concurrency = 256
requests_per_minute = 6000000
tokens_per_minute = 600000000

[kinds.chat]
adapter = "openai"
base_url = "{provider}/v1"
models = ["{model}"]
resource = "openai"
price = {{ input_per_1m = 0.15, output_per_1m = 0.6 }}

[worker]
concurrency = 128
"""
LITELLM_CONFIG = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {provider}/v1
      api_key: sk-sim
general_settings:
  master_key: sk-{key}
"""


async def answers(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            return (await http.get(url)).status_code == 200
    except httpx.HTTPError:
        return False


async def until_up(url: str, timeout: float) -> None:
    await until(lambda: answers(url), timeout, f"GET {url} answers 200")


@contextmanager
def process(
    args: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> Iterator[int]:
    """Run ``args`` in ``cwd``: ``python -m`` imports from there first, ahead of PYTHONPATH
    (from this tree, ``--floodway-src`` would have measured this tree)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, cwd=cwd
        )
    try:
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wrk(url: str, path: str, connections: int, seconds: float, script: Path) -> dict[str, Any]:
    threads = 1 if connections == 1 else 2
    run = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script), url,
         "--", path],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        raise SystemExit(f"wrk failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    figures: dict[str, Any] = json.loads(lines[-1])
    if figures["not_200"]:
        raise SystemExit(f"wrk {url}{path}: answers other than 200: {figures}")
    return figures


def measure(
    name: str, url: str, path: str, pid: int, seconds: float, script: Path
) -> dict[str, dict[str, float]]:
    """One at a time, then 64 at once, after a warm-up: rate, p50, p99 and server CPU."""
    wrk(url, path, CONCURRENT, min(2.0, seconds), script)
    out = {}
    for label, connections in (("one", 1), ("many", CONCURRENT)):
        before = cpu_s(pid)
        got = wrk(url, path, connections, seconds, script)
        cpu = cpu_s(pid) - before
        n = got["requests"]
        out[label] = {
            "requests_per_s": round(n / (got["duration_us"] / 1e6), 1),
            "p50_ms": got["p50_us"] / 1000,
            "p99_ms": got["p99_us"] / 1000,
            "server_cpu_ms": round(1000 * cpu / n, 3),
            "requests": n,
            "socket_errors": got["socket_errors"],  # wrk's: timeouts (2 s) and resets
        }
        print(f"{name:9} {label:4}: {json.dumps(out[label])}", flush=True)
    return out


async def first_events(url: str, path: str, key: str, streams: int) -> dict[str, float]:
    """Seconds from sending a ``stream: true`` chat request to its first ``data:`` line, one
    request at a time, each prompt distinct (nothing is shared)."""
    waits: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        for n in range(streams + 20):
            prompt = [{"role": "user", "content": f"stream {n} {os.getpid()}"}]
            body = {"model": MODEL, "stream": True, "messages": prompt}
            sent = loop.time()
            async with http.stream("POST", path, json=body) as answer:
                if answer.status_code != 200:
                    raise SystemExit(f"{url}{path}: {answer.status_code} {await answer.aread()!r}")
                first = None
                async for line in answer.aiter_lines():
                    if first is None and line.startswith("data:"):
                        first = loop.time() - sent
            if n >= 20 and first is not None:
                waits.append(first)
    return {
        "p50_ms": round(1000 * percentile(waits, 50), 2),
        "p99_ms": round(1000 * percentile(waits, 99), 2),
        "streams": len(waits),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = 3.0 if args.quick else args.seconds
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        script = folder / "chat.lua"
        script.write_text(WRK_SCRIPT % {"key": KEY, "model": MODEL})
        script.with_name("litellm.lua").write_text(
            WRK_SCRIPT % {"key": f"sk-{KEY}", "model": MODEL}
        )
        port = free_port()
        provider = f"http://127.0.0.1:{port}"
        sim = [sys.executable, "-m", "floodway.cli", "simulate", "--openai", "--port", str(port),
               "--latency-ms", "0"]  # fmt: skip
        rows: dict[str, Any] = {}
        with process(sim, folder / "sim.log", {"PYTHONPATH": str(ROOT)}) as sim_pid:
            await until_up(f"{provider}/v1/models", timeout=30)
            rows["provider"] = measure("provider", provider, "/v1/chat/completions", sim_pid,
                                       seconds, script)  # fmt: skip
            streams = 40 if args.quick else STREAMS
            rows["provider"]["stream"] = await first_events(
                provider, "/v1/chat/completions", "sk-sim", streams
            )
            print(f"provider  stream: {json.dumps(rows['provider']['stream'])}", flush=True)
            rows["floodway"] = await _floodway(args, folder, provider, seconds, script)
            if args.litellm:
                rows["litellm"] = await _litellm(args.litellm, folder, provider, seconds, script)
    direct, through = rows["provider"]["one"], rows["floodway"]["one"]
    figures: dict[str, Any] = {
        **rows,
        "floodway_added_p50_ms": round(through["p50_ms"] - direct["p50_ms"], 2),
        "floodway_added_p99_ms": round(through["p99_ms"] - direct["p99_ms"], 2),
        "floodway_requests_per_s_64": rows["floodway"]["many"]["requests_per_s"],
        "floodway_added_first_event_p50_ms": round(
            rows["floodway"]["stream"]["p50_ms"] - rows["provider"]["stream"]["p50_ms"], 2
        ),
        "floodway_added_first_event_p99_ms": round(
            rows["floodway"]["stream"]["p99_ms"] - rows["provider"]["stream"]["p99_ms"], 2
        ),
        "floodway_src": str(args.floodway_src or ROOT),
    }
    if "litellm" in rows:
        figures["litellm_added_p50_ms"] = round(
            rows["litellm"]["one"]["p50_ms"] - direct["p50_ms"], 2
        )
        figures["litellm_requests_per_s_64"] = rows["litellm"]["many"]["requests_per_s"]
    passed = (
        figures["floodway_added_p50_ms"] <= 2
        and figures["floodway_added_p99_ms"] <= 10
        and figures["floodway_requests_per_s_64"] >= 1000
    )
    return {
        "id": "O4",
        "scenario": "chat requests through /openai/v1 (SQLite ledger, limits, price, budget) "
        "against the provider directly, from wrk, one at a time and 64 at once; a stream's "
        "first event one at a time, from httpx",
        "floor": "added p50 <= 2 ms and p99 <= 10 ms one at a time; >= 1,000 req/s at 64",
        "passed": passed,
        "figures": figures,
    }


async def _floodway(
    args: argparse.Namespace, folder: Path, provider: str, seconds: float, script: Path
) -> dict[str, Any]:
    config = folder / "floodway.toml"
    config.write_text(
        FLOODWAY_CONFIG.format(folder=folder, key=KEY, provider=provider, model=MODEL)
    )
    port = free_port()
    src = Path(args.floodway_src or ROOT)
    command = [sys.executable, "-m", "floodway.cli", "serve", "--config", str(config), "--port",
               str(port)]  # fmt: skip
    with process(command, folder / "floodway.log", {"PYTHONPATH": str(src)}, src) as pid:
        url = f"http://127.0.0.1:{port}"
        await until_up(f"{url}/readyz", timeout=60)
        out: dict[str, Any] = measure("floodway", url, "/openai/v1/chat/completions", pid,
                                      seconds, script)  # fmt: skip
        streams = 40 if args.quick else STREAMS
        out["stream"] = await first_events(url, "/openai/v1/chat/completions", KEY, streams)
        print(f"floodway  stream: {json.dumps(out['stream'])}", flush=True)
        return out


async def _litellm(
    litellm: str, folder: Path, provider: str, seconds: float, script: Path
) -> dict[str, Any]:
    config = folder / "litellm.yaml"
    config.write_text(LITELLM_CONFIG.format(model=MODEL, provider=provider, key=KEY))
    port = free_port()
    command = [litellm, "--config", str(config), "--port", str(port), "--num_workers", "1"]
    # The model price map from its package, not the network: the machine is offline.
    offline = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with process(command, folder / "litellm.log", offline) as pid:
        await until_up(f"http://127.0.0.1:{port}/health/liveliness", timeout=120)
        return measure("litellm", f"http://127.0.0.1:{port}", "/v1/chat/completions", pid,
                       seconds, script.with_name("litellm.lua"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description="O4: the OpenAI front's overhead, from wrk")
    parser.add_argument("--quick", action="store_true", help="3 s runs, a -quick file")
    parser.add_argument("--seconds", type=float, default=10.0, help="each wrk run's length")
    parser.add_argument("--floodway-src", type=Path, help="run floodway from this source tree")
    parser.add_argument("--litellm", help="the LiteLLM proxy's command, to measure beside")
    parser.add_argument("--name", default="openai-O4", help="the results file's name")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    result = asyncio.run(run(args))
    result["quick"] = args.quick
    path = write_result(args.name + ("-quick" if args.quick else ""), result)
    print(f"O4: {json.dumps(result['figures'])} -> {path}")


if __name__ == "__main__":
    main()
