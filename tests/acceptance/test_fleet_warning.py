"""Without Redis, limits are per process: a process that finds other workers on its ledger says
so (floodway.maintenance.limits_watch). Two Floodway instances stand for two processes on one
ledger: the watch uses only store verbs, so they see each other as separate processes would."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg
import pytest

from floodway import Floodway
from floodway.maintenance.limits_watch import LocalLimitsWatch
from floodway.store.base import ClaimParams
from harness.fleet import KIND, PG_URL, build, fresh_database
from harness.processes import until

WARNING = "limits are per process"


@pytest.fixture(params=["sqlite", "postgres"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/fleet.db"
        return
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {PG_URL} is unavailable: {exc}")
    async with fresh_database() as url:
        yield url


@asynccontextmanager
async def process(database: str, *, redis: str = "", cap: int = 10) -> AsyncIterator[Floodway]:
    fw = build(database, "http://127.0.0.1:9", redis=redis, cap=cap)
    async with fw:
        yield fw


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "floodway.fleet"]


async def test_each_process_warns_once_it_sees_a_peer(
    ledger: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "floodway.fleet")
    async with process(ledger) as a, process(ledger) as b:
        watch_a = LocalLimitsWatch(a.runtime, ["host-a:1:w"], identity="host-a:1")
        watch_b = LocalLimitsWatch(b.runtime, ["host-b:2:w"], identity="host-b:2")
        assert watch_a.active and watch_b.active

        assert await watch_a.check_once() == set()  # alone so far: it holds the lease
        assert warnings(caplog) == []

        assert await watch_b.check_once() == {"?"}  # the lease is held by a live peer
        [message] = warnings(caplog)
        assert WARNING in message and "sim" in message and "FLOODWAY_REDIS" in message

        # The lease holder learns of the peer from the peer's running tasks.
        task = await a.submit(KIND, {"n": 1})
        now = b.clock.now()
        claimed = await b.store.claim(
            ClaimParams("host-b:2:w", "token", (KIND,), 1, now, 30.0, ids=(task.id,))
        )
        assert [t.id for t in claimed] == [task.id]
        assert await watch_a.check_once() == {"host-b:2:w"}
        assert len(warnings(caplog)) == 2
        assert "host-b:2:w" in warnings(caplog)[-1]

        # Once per repeat_s, not once per round.
        assert await watch_b.check_once() == {"?"}
        assert await watch_a.check_once() == {"host-b:2:w"}
        assert len(warnings(caplog)) == 2

        # A stopped process hands the lease back: the next one is not told of a ghost.
        await watch_a.stop()
        caplog.clear()
        watch_c = LocalLimitsWatch(a.runtime, identity="host-c:3")
        assert await watch_c.check_once() == {"host-b:2:w"}  # b still runs a task
        await watch_b.stop()


async def test_the_watch_runs_in_the_background_until_stopped(
    ledger: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "floodway.fleet")
    async with process(ledger) as a, process(ledger) as b:
        first = LocalLimitsWatch(a.runtime, identity="host-a:1")
        await first.check_once()
        watch = LocalLimitsWatch(b.runtime, ["host-b:2:w"], every_s=0.05)
        watch.start()
        try:

            async def warned() -> bool:
                return watch.warnings >= 1

            await until(warned, 10, "the background watch warns")
        finally:
            await watch.stop()
        assert watch.peers == {"?"}
        assert any(WARNING in m for m in warnings(caplog))
        await first.stop()


async def test_no_warning_when_limits_are_shared_or_absent(
    ledger: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "floodway.fleet")
    # Redis configured: one set of limits for the fleet (never contacted here).
    async with (
        process(ledger) as local,
        process(ledger, redis="redis://127.0.0.1:9/0") as shared,
    ):
        await LocalLimitsWatch(local.runtime, identity="host-a:1").check_once()
        watch = LocalLimitsWatch(shared.runtime, identity="host-b:2")
        assert not watch.active
        assert await watch.check_once() == set()
    # Nothing limited: nothing to exceed.
    unlimited = Floodway(database=ledger)
    async with unlimited:
        assert not LocalLimitsWatch(unlimited.runtime).active
    assert warnings(caplog) == []
