"""Recovery from a SIGKILL, as the provider sees it: a dead worker's tasks move on at once
(the ledger sees its death, it does not wait for its leases), and the calls it left running at
the provider keep counting against the cap until they could have ended.

Real ``floodway worker`` processes on one ledger (SQLite with in-process limits; PostgreSQL
with Redis), the simulated provider on loopback. Leases are long (5 minutes): a test that only
passed once they expire would time out instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from floodway import Floodway, Status, Task
from floodway.providers.sim import SimulatorConfig, running_simulator
from harness.fleet import KIND, PG_URL, build, fresh_database, private_redis, spawn_worker
from harness.processes import until

LONG_LEASE = "300s"


@pytest.fixture(params=["sqlite", "postgres"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """(database, redis): SQLite with in-process limits, or PostgreSQL with a private Redis."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/crash.db", ""
        return
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {PG_URL} is unavailable: {exc}")
    async with fresh_database() as database, private_redis(tmp_path) as redis:
        yield database, redis.url


async def test_a_restart_after_a_crash_never_exceeds_the_cap(
    ledger: tuple[str, str], tmp_path: Path
) -> None:
    """Cap 10, calls of 2 s, the worker killed with 10 in flight and restarted at once: the
    provider, which neither honours keys nor has a lookup, never serves more than 10."""
    database, redis = ledger
    config = SimulatorConfig(latency_ms=2000, honor_idempotency_key=False, seed=1)
    async with running_simulator(config) as sim:
        fw = build(database, sim.url, redis=redis, idempotent=False, lookup=False)
        try:
            tasks = await fw.submit_many(KIND, [{"n": i} for i in range(25)])
            spawn = {"lease": LONG_LEASE, "idempotent": False, "lookup": False, "timeout_s": 4.0}
            first = spawn_worker(database, redis, sim.url, tmp_path / "w1.log", **spawn)

            async def cap_in_flight() -> bool:
                return sim.state.stats.in_flight >= 10

            await until(cap_in_flight, 30, "10 calls in flight")
            first.kill()
            second = spawn_worker(database, redis, sim.url, tmp_path / "w2.log", **spawn)
            try:
                final = await _all_terminal(fw, [t.id for t in tasks], 90)
            finally:
                second.stop()
        finally:
            await fw.close()
    stats = sim.state.stats
    assert stats.peak_concurrency <= 10, stats.as_dict()
    assert stats.rate_limited == 0
    states = Counter(t.status for t in final)
    # The ten calls cut off by the kill cannot be looked up or safely resent: interrupted.
    assert states == {Status.SUCCEEDED: 15, Status.FAILED: 10}, states
    interrupted = [t for t in final if t.status is Status.FAILED]
    assert all(t.error is not None and t.error.type == "worker_lost" for t in interrupted)
    assert sim.state.ledger.as_dict()["double_charged"] == []


async def test_a_dead_workers_tasks_move_on_before_its_leases_expire(
    ledger: tuple[str, str], tmp_path: Path
) -> None:
    """A provider that honours keys: the killed worker's tasks are resubmitted at once (each
    takes over its own orphaned call's slot) and billed once."""
    database, redis = ledger
    config = SimulatorConfig(latency_ms=1500, seed=2)
    async with running_simulator(config) as sim:
        fw = build(database, sim.url, redis=redis)
        try:
            tasks = await fw.submit_many(KIND, [{"n": i} for i in range(20)])
            victim = spawn_worker(database, redis, sim.url, tmp_path / "w1.log", lease=LONG_LEASE)

            async def busy() -> bool:
                return sim.state.stats.in_flight >= 10

            await until(busy, 30, "the victim's calls in flight")
            victim.kill()
            survivor = spawn_worker(database, redis, sim.url, tmp_path / "w2.log")
            try:
                final = await _all_terminal(fw, [t.id for t in tasks], 60)
            finally:
                survivor.stop()
        finally:
            await fw.close()
    assert Counter(t.status for t in final) == {Status.SUCCEEDED: 20}
    assert sim.state.ledger.as_dict()["double_charged"] == []
    assert sim.state.stats.peak_concurrency <= 10


async def _all_terminal(fw: Floodway, ids: list[str], timeout: float) -> list[Task]:
    async def done() -> bool:
        return all([(await fw.get(i)).terminal for i in ids])

    await until(done, timeout, "every task terminal")
    return [await fw.get(i) for i in ids]
