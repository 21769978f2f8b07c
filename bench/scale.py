"""T2: claim latency (p50/p99) and worker RSS with 1,000 and with 1,000,000 queued tasks.

    python -m bench.scale [--big 1000000]

The queue is filled with one bulk INSERT per 50,000 rows (the schema comes from the store's
own migrations), then 500 single-task claims are timed, each followed by its completion.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sqlite3
import tempfile
import time

from bench.common import percentile, write_result
from floodway.core.outcome import Completion
from floodway.core.states import Status
from floodway.core.task import new_id
from floodway.store.base import ClaimParams
from floodway.store.sqlite import SqliteStore


def fill(path: str, count: int) -> None:
    conn = sqlite3.connect(path)
    now = time.time()
    rows = (
        (
            new_id(now),
            "noop",
            "queued",
            "background",
            1,
            "default",
            json.dumps({"n": i}),
            4,
            0.0,
            now,
            now,
            now,
            "{}",
        )
        for i in range(count)
    )
    sql = (
        "INSERT INTO tasks (id, kind, status, lane, lane_rank, tenant, input, max_attempts, "
        "cost_estimated, created_at, updated_at, next_attempt_at, metadata) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
    )
    conn.execute("BEGIN")
    conn.executemany(sql, rows)
    conn.execute("COMMIT")
    conn.close()


async def measure(path: str, claims: int) -> list[float]:
    store = SqliteStore(f"sqlite:///{path}")
    await store.open()
    latencies = []
    try:
        for i in range(claims):
            now = time.time()
            t0 = time.perf_counter()
            got = await store.claim(ClaimParams("bench", f"tok{i}", ("noop",), 1, now, 30))
            latencies.append((time.perf_counter() - t0) * 1000)
            await store.complete(
                [Completion(got[0].id, Status.SUCCEEDED, Status.RUNNING, got[0].lease_token)], now
            )
    finally:
        await store.close()
    return latencies


async def prepare(path: str) -> None:
    store = SqliteStore(f"sqlite:///{path}")
    await store.open()
    await store.close()


def run(size: int, claims: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/scale.db"
        asyncio.run(prepare(path))
        t0 = time.perf_counter()
        fill(path, size)
        fill_s = time.perf_counter() - t0
        lat = asyncio.run(measure(path, claims))
    return {
        "queued": size,
        "fill_s": fill_s,
        "claim_p50_ms": percentile(lat, 50),
        "claim_p99_ms": percentile(lat, 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--claims", type=int, default=500)
    args = parser.parse_args()
    small = run(args.small, args.claims)
    print(
        f"{args.small:>9,} queued: p50 {small['claim_p50_ms']:.3f} ms, "
        f"p99 {small['claim_p99_ms']:.3f} ms"
    )
    big = run(args.big, args.claims)
    print(
        f"{args.big:>9,} queued: p50 {big['claim_p50_ms']:.3f} ms, p99 {big['claim_p99_ms']:.3f} ms"
    )
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures = {
        "scenario": "T2",
        "small": small,
        "big": big,
        "p99_ratio_big_to_small": big["claim_p99_ms"] / small["claim_p99_ms"],
        "peak_rss_mb": rss_mb,
    }
    path = write_result("scale-sqlite", figures)
    print(f"p99 ratio {figures['p99_ratio_big_to_small']:.2f}, peak RSS {rss_mb:.0f} MB -> {path}")


if __name__ == "__main__":
    main()
