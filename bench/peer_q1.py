"""Q1's peer: the same 200 calls against the same simulated provider (cap 10, 500 ms +-20 %,
5 % 5xx, the same seed), run by Dramatiq as its users would keep to a cap of 10 (see
``bench/peer_dramatiq_q1.py``), beside floodway's run in ``python -m bench.quota Q1 --peers``.

Each run: a fresh simulator in this event loop, a private ``redis-server`` (broker and rate
limiter), the 200 messages enqueued, then the ``dramatiq`` command started with no flags.
The makespan runs from the provider's first request to the moment its 200th success is seen
(its counters read every 10 ms), so the worker processes' start-up is not counted (floodway's
run counts its worker's); the optimum is Q1's, the provider's busy time over the cap.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker

from bench.apps import q1 as q1app
from bench.peer_dramatiq_q1 import ACTOR
from floodway.providers.sim import running_simulator
from harness.fleet import private_redis

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.01
#: what Dramatiq's Retries middleware logs (at the CLI's INFO level) for each message it retries
RETRYING = "Retrying message"
#: a run that has not finished by then has lost messages (retries exhausted)
GIVE_UP_S = 600.0


def _enqueue(url: str, tag: str, count: int) -> None:
    broker = RedisBroker(url=url)  # type: ignore[no-untyped-call]  # untyped upstream
    try:
        for n in range(count):
            message: Message[Any] = Message(
                queue_name="default",
                actor_name=ACTOR,
                args=(tag, n),
                kwargs={},
                options={},
            )
            broker.enqueue(message)
    finally:
        broker.close()


async def dramatiq_run(seed: int, quick: bool) -> dict[str, Any]:
    n, latency_ms = (40, 100.0) if quick else (q1app.TASKS, q1app.LATENCY_MS)
    async with running_simulator(q1app.simulator(seed, latency_ms)) as sim:
        with tempfile.TemporaryDirectory(prefix="floodway-peer-") as name:
            tmp = Path(name)
            async with private_redis(tmp / "redis") as server:
                await asyncio.to_thread(_enqueue, server.url, f"dramatiq-{seed}", n)
                env = {
                    **os.environ,
                    "PYTHONPATH": str(ROOT),
                    "DRAMATIQ_REDIS": server.url,
                    "SIM_URL": sim.url,
                }
                log = tmp / "dramatiq.log"
                with log.open("ab") as out:
                    worker = subprocess.Popen(
                        [sys.executable, "-m", "dramatiq", "bench.peer_dramatiq_q1"],
                        env=env,
                        cwd=ROOT,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                try:
                    span = await _until_done(sim.state.stats, n, worker, log)
                finally:
                    worker.terminate()
                    await asyncio.to_thread(worker.wait, 30)
                text = await asyncio.to_thread(log.read_text, errors="replace")
        stats = sim.state.stats
        ledger = sim.state.ledger.as_dict()
    optimum = stats.busy_s / q1app.CAP
    return {
        "makespan_s": span,
        "optimum_s": optimum,
        "makespan_over_optimum": span / optimum,
        "requests": stats.requests,
        "rate_limited_429": stats.rate_limited,
        "errors_5xx": stats.errors_5xx,
        # the Retries middleware logs each message it puts back: a 5xx, or a full limiter
        "retried": text.count(RETRYING),
        "refused_by_limiter": text.count(RETRYING) - stats.errors_5xx,
        "peak_concurrency": stats.peak_concurrency,
        "failed": n - stats.succeeded,
        "double_charged": len(ledger["double_charged"]),
    }


async def _until_done(stats: Any, count: int, worker: subprocess.Popen[bytes], log: Path) -> float:
    """Seconds from the provider's first request until its ``count``-th success."""
    began = time.monotonic()
    first: float | None = None
    while stats.succeeded < count:
        now = time.monotonic()
        if first is None and stats.requests:
            first = now
        if worker.poll() is not None:
            tail = await asyncio.to_thread(log.read_text, errors="replace")
            raise SystemExit(f"dramatiq exited:\n{tail[-2000:]}")
        if now - began > GIVE_UP_S:
            raise SystemExit(f"dramatiq did {stats.succeeded} of {count} in {GIVE_UP_S:g} s")
        await asyncio.sleep(POLL_S)
    assert first is not None
    return time.monotonic() - first
