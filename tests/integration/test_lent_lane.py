"""A duplicate interactive task lends its lane to the work it waits for, and a dispatcher that
is already running sees the loan: the work runs next, not behind the background queue.

On both ledgers, time on a fake clock (the calls take 1 s of it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from floodway import Context, Floodway, Status
from floodway.config import ResourceConfig, Settings
from floodway.core.states import TERMINAL
from floodway.testing import FakeClock, settle
from harness.pg import fresh_schema, postgres_unavailable, schema_url


@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/floodway.db"
        return
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    async with fresh_schema() as schema:
        yield schema_url(schema)


async def test_a_running_dispatcher_sees_a_lent_lane(database: str, clock: FakeClock) -> None:
    settings = Settings(database=database, resources={"p": ResourceConfig(concurrency=1)})
    fw = Floodway(settings=settings, clock=clock)
    order: list[int] = []

    @fw.kind("slow", resource="p")
    async def slow(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        order.append(value["n"])
        await clock.sleep(1.0)
        return value

    async with fw:
        background = await fw.submit_many("slow", [{"n": n} for n in range(9)])
        x = background[-1]
        async with fw.worker(concurrency=4):
            while not order:  # the worker runs: the first background call is under way
                await settle()
            start = clock.now()
            duplicate = await fw.submit("slow", {"n": 8}, lane="interactive", deadline_s=4)
            distinct = await fw.submit("slow", {"n": 100}, lane="interactive")
            assert duplicate.waits_for == x.id
            ends: dict[str, float] = {}
            while len(ends) < 2 and clock.now() - start < 6:
                await clock.advance(0.1)
                await settle()
                for task in (duplicate, distinct):
                    if task.id not in ends and (await fw.get(task.id)).status in TERMINAL:
                        ends[task.id] = clock.now() - start
            dup, dis = await fw.get(duplicate.id), await fw.get(distinct.id)
    assert dup.status is Status.DEDUPED and dup.result == {"n": 8}
    assert dis.status is Status.SUCCEEDED
    # X and the distinct task both run right after the call that was under way.
    assert set(order[1:3]) == {8, 100}
    assert ends[duplicate.id] <= ends[distinct.id] + 1.0 + 0.2
