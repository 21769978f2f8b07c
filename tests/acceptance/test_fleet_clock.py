"""Two ``floodway api`` processes whose host clocks differ by 10 s, and a worker process, on
one PostgreSQL ledger: every process keeps the ledger's time, so a task submitted through
the process ahead is due at once (not 10 s later) and its worker's lease is not taken for
expired by the other processes' sweepers."""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from floodway import Floodway, Status
from floodway.core.states import TERMINAL
from floodway.providers.sim import RunningSimulator, SimulatorConfig, running_simulator
from harness.fleet import (
    KIND,
    PG_URL,
    RedisServer,
    build,
    fresh_database,
    private_redis,
    spawn_api,
    spawn_worker,
)
from harness.processes import until

pytestmark = pytest.mark.slow

SKEW_S = 10.0
TASKS = 20


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[tuple[str, RedisServer, RunningSimulator]]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {PG_URL} is unavailable: {exc}")
    config = SimulatorConfig(latency_ms=50, max_concurrency=10, seed=7)
    async with (
        fresh_database() as database,
        private_redis(tmp_path / "redis") as redis,
        running_simulator(config) as sim,
    ):
        yield database, redis, sim


async def test_a_task_submitted_through_a_process_ahead_starts_at_once(
    ledger: tuple[str, RedisServer, RunningSimulator], tmp_path: Path
) -> None:
    database, redis, sim = ledger
    ahead = spawn_api(
        database,
        redis.url,
        sim.url,
        tmp_path / "ahead.log",
        extra_env={"FLEET_CLOCK_SKEW": str(SKEW_S)},
    )
    on_time = spawn_api(database, redis.url, sim.url, tmp_path / "on_time.log")
    # A lease shorter than the skew (a sweeper ahead would take it for expired), long enough
    # for heartbeats on a loaded machine.
    worker = spawn_worker(database, redis.url, sim.url, tmp_path / "worker.log", lease="5s")
    fw: Floodway = build(database, sim.url, redis=redis.url)
    try:
        await until(ahead.healthy, 60, "the API process ahead answers")
        await until(on_time.healthy, 60, "the API process on time answers")
        await until(lambda: _ready(worker.ready()), 60, "the worker started")
        async with fw:
            submitted_at = time.time()  # this host's true time: the ledger's
            ids = await ahead.submit_batch(KIND, [{"n": i} for i in range(TASKS)])

            async def ended() -> bool:
                return all([(await fw.get(i)).status in TERMINAL for i in ids])

            await until(ended, 60, "every task ended")
            tasks = [await fw.get(i) for i in ids]
    finally:
        for process in (ahead, on_time, worker):
            process.stop(10)
    for task in tasks:
        assert task.status is Status.SUCCEEDED and task.attempts == 1
        # Written by the process ahead, in the ledger's time.
        assert abs(task.created_at - submitted_at) < SKEW_S / 2
        # Started by the worker (on time) without waiting out the skew.
        assert task.started_at is not None and task.started_at - submitted_at < SKEW_S / 2
    assert sim.state.ledger.as_dict()["double_charged"] == []
    assert "s ahead of the ledger's" in ahead.output()  # the skewed host is told


async def _ready(value: bool) -> bool:
    return value
