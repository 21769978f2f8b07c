"""A Floodway with a worker and its maintenance on a fake clock shared with a simulated
provider's batch API (served over HTTP), so batches held for hours finish in moments: the
rig of the batch-tier tests, whichever provider they run against."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx
from starlette.applications import Starlette

from floodway import Floodway, Settings, Status, Task
from floodway.core.backoff import Backoff
from floodway.core.retry import RetryPolicy
from floodway.maintenance.loop import Maintenance
from floodway.providers.registry import aclose_kinds
from floodway.serving import serve_app
from floodway.store.base import TaskQuery
from floodway.testing import FakeClock

HOUR = 3600.0
Sim = TypeVar("Sim")


@dataclass
class Rig(Generic[Sim]):
    fw: Floodway
    sim: Sim
    url: str
    clock: FakeClock
    #: driven by the test, a round per step: a fake clock's hours would otherwise wake its
    #: every-second loop thousands of times
    maintenance: Maintenance

    async def ledger(self) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=self.url) as http:
            body: dict[str, Any] = (await http.get("/ledger")).json()
            return body

    async def step(self, seconds: float) -> None:
        await self.clock.jump(seconds)
        await self.maintenance.tick()
        await asyncio.sleep(0.02)  # a real pause: for the HTTP and the ledger's threads

    async def queued(self, n: int) -> None:
        """Until ``n`` lines wait in the ledger and each of their tasks is parked on its line:
        a handler between the two would time out at the first step of the clock."""
        for _ in range(6000):  # a minute at most, on a loaded machine
            pools = await self.fw.runtime.tier_records.pools()
            running = await self.fw.list_tasks(TaskQuery(status=Status.RUNNING, limit=1000))
            if sum(p.lines for p in pools) >= n and all(t.parked for t in running):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{n} lines never queued and parked: {pools}")

    async def run_until_done(self, tasks: list[Task], step_s: float, steps: int) -> list[Task]:
        """Move the shared clock in steps until every task ended."""
        ids = [t.id for t in tasks]
        for _ in range(steps):
            if len(await self.fw.runtime.store.ended(ids)) == len(ids):
                break
            await self.step(step_s)
        return [await self.fw.get(i) for i in ids]


@asynccontextmanager
async def tier_rig(
    app: Starlette,
    db_url: str,
    clock: FakeClock,
    kind: dict[str, Any],
    resources: dict[str, Any] | None = None,
) -> AsyncIterator[Rig[Any]]:
    """The rig on ``app`` (a simulator on ``clock``), with one kind ``chat`` configured by
    ``kind`` (``{url}`` in its ``base_url`` is the simulator's)."""
    async with serve_app(app) as url:
        config = {**kind, "base_url": str(kind["base_url"]).format(url=url)}
        fw = Floodway(
            settings=Settings(database=db_url, kinds={"chat": config}, resources=resources or {}),
            clock=clock,
            policy=RetryPolicy(backoff=Backoff(base_s=0.01, cap_s=0.05)),
        )
        try:
            async with fw, fw.worker(concurrency=32, maintenance=False):
                yield Rig(fw, app.state.simulator, url, clock, Maintenance(fw.runtime))
        finally:
            await aclose_kinds(fw.kinds)
