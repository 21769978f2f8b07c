"""The OpenAI-compatible front (/openai/v1) against an OpenAI-compatible fake provider.

    python -m bench.openai_front           # writes bench/results/openai-O1.json, -O2.json, -O3.json
    python -m bench.openai_front --quick   # smaller sizes, -quick files

O1: a Batch of 200 chat requests (upload, create, poll until completed, download), the provider
answering in 500 ms and floodway's resource capped at 10 concurrent: makespan against the
optimum (200 x 0.5 s / 10), with a storm of 20 provider 429s at the start.
O2: 50 chat requests at once, each an HTTP request that waits for its answer (provider 200 ms,
cap 10): the slowest answer against the optimum, and 429s seen by the clients (none allowed).
O3: floodway's own time per call: 30 calls one after another, the provider answering at once;
the figure is the client's round trip (submit, dispatch, provider, answer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import median, percentile, write_result
from floodway import Floodway
from floodway.api import create_app
from floodway.config import ApiConfig, KindConfig, ResourceConfig, Settings
from floodway.serving import serve_app
from harness.openai_fake import FakeOpenAI

KEY = "bench-key"
CAP = 10


async def front(fake: FakeOpenAI, folder: Path) -> tuple[Any, str]:
    """floodway in front of ``fake``: (the served apps' exit stack, floodway's base URL)."""
    from contextlib import AsyncExitStack

    stack = AsyncExitStack()
    upstream = await stack.enter_async_context(serve_app(fake.app()))
    settings = Settings(
        database=f"sqlite:///{folder / 'bench.db'}",
        api=ApiConfig(keys={KEY: "bench"}),
        resources={"openai": ResourceConfig(concurrency=CAP)},
        kinds={
            "chat": KindConfig(
                adapter="openai",
                resource="openai",
                base_url=f"{upstream}/v1",
                models=["gpt-4o-mini"],
                dedupe=False,
            )
        },
    )
    app = create_app(Floodway(settings=settings), run_workers=True, concurrency=2 * CAP)
    url = await stack.enter_async_context(serve_app(app))
    return stack, url


def chat(text: str) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}


async def o1_batch(requests: int, folder: Path) -> dict[str, Any]:
    fake = FakeOpenAI(latency_s=0.5, retry_after_ms=200)
    fake.storm(20)
    stack, url = await front(fake, folder)
    async with stack, httpx.AsyncClient(base_url=f"{url}/openai/v1", timeout=60) as http:
        http.headers["Authorization"] = f"Bearer {KEY}"
        lines = [
            {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": chat(f"image {i}")}
            for i in range(requests)
        ]  # fmt: skip
        content = "".join(json.dumps(line) + "\n" for line in lines).encode()
        upload = await http.post(
            "/files", files={"file": ("b.jsonl", content)}, data={"purpose": "batch"}
        )
        started = time.monotonic()
        batch = (
            await http.post(
                "/batches",
                json={
                    "input_file_id": upload.json()["id"],
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
            )
        ).json()
        while batch["status"] != "completed":
            await asyncio.sleep(0.05)
            batch = (await http.get(f"/batches/{batch['id']}")).json()
        makespan = time.monotonic() - started
        output = (await http.get(f"/files/{batch['output_file_id']}/content")).text
    answered = [json.loads(line)["custom_id"] for line in output.splitlines()]
    optimum = requests * 0.5 / CAP
    figures = {
        "makespan_over_optimum": round(makespan / optimum, 3),
        "makespan_s": round(makespan, 2),
        "optimum_s": optimum,
        "provider_peak_concurrency": fake.peak_in_flight,
        "provider_429s": fake.throttled,
        "billed": len(fake.billed),
        "answered_once": sorted(answered) == sorted(f"r{i}" for i in range(requests)),
    }
    passed = (
        figures["answered_once"] is True
        and figures["billed"] == requests
        and fake.peak_in_flight <= CAP
    )
    return {
        "id": "O1",
        "scenario": f"OpenAI Batch of {requests} chat requests, provider 500 ms, cap {CAP}, "
        "20 provider 429s at the start",
        "floor": "every custom_id answered once; billed once each; provider peak <= cap",
        "passed": passed,
        "figures": figures,
    }


async def o2_waiting(requests: int, folder: Path) -> dict[str, Any]:
    fake = FakeOpenAI(latency_s=0.2)
    stack, url = await front(fake, folder)
    async with stack, httpx.AsyncClient(base_url=f"{url}/openai/v1", timeout=60) as http:
        http.headers["Authorization"] = f"Bearer {KEY}"
        started = time.monotonic()

        async def one(i: int) -> tuple[int, float]:
            answer = await http.post("/chat/completions", json=chat(f"q{i}"))
            return answer.status_code, time.monotonic() - started

        done = await asyncio.gather(*(one(i) for i in range(requests)))
    optimum = requests * 0.2 / CAP
    last = max(t for _, t in done)
    figures = {
        "last_answer_over_optimum": round(last / optimum, 3),
        "last_answer_s": round(last, 2),
        "optimum_s": optimum,
        "answered_200": sum(1 for code, _ in done if code == 200),
        "client_429s": sum(1 for code, _ in done if code == 429),
        "provider_peak_concurrency": fake.peak_in_flight,
    }
    return {
        "id": "O2",
        "scenario": f"{requests} waiting chat requests at once (interactive depth 5), "
        f"provider 200 ms, cap {CAP}",
        "floor": "every request answered 200; no 429 to a client; provider peak <= cap",
        "passed": figures["answered_200"] == requests and fake.peak_in_flight <= CAP,
        "figures": figures,
    }


async def o3_overhead(calls: int, folder: Path) -> dict[str, Any]:
    fake = FakeOpenAI()
    stack, url = await front(fake, folder)
    async with stack, httpx.AsyncClient(base_url=f"{url}/openai/v1", timeout=60) as http:
        http.headers["Authorization"] = f"Bearer {KEY}"
        await http.post("/chat/completions", json=chat("warm-up"))
        took = []
        for i in range(calls):
            started = time.monotonic()
            answer = await http.post("/chat/completions", json=chat(f"o{i}"))
            answer.raise_for_status()
            took.append(1000 * (time.monotonic() - started))
    figures = {
        "round_trip_p50_ms": round(median(took), 1),
        "round_trip_p90_ms": round(percentile(took, 90), 1),
        "calls": calls,
    }
    return {
        "id": "O3",
        "scenario": "one chat call at a time through /openai/v1, provider answering at once",
        "floor": "(reported)",
        "passed": None,
        "figures": figures,
    }


async def main(quick: bool) -> None:
    suffix = "-quick" if quick else ""
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            ("O1", o1_batch(40 if quick else 200, Path(tmp) / "o1")),
            ("O2", o2_waiting(20 if quick else 50, Path(tmp) / "o2")),
            ("O3", o3_overhead(10 if quick else 30, Path(tmp) / "o3")),
        ]
        for name, run in runs:
            (Path(tmp) / name.lower()).mkdir()
            result = await run
            result["quick"] = quick
            path = write_result(f"openai-{name}{suffix}", result)
            print(f"{name}: {json.dumps(result['figures'])} -> {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the /openai/v1 front against a fake provider")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, -quick files")
    asyncio.run(main(parser.parse_args().quick))
