"""The maintenance services, run wherever workers run: one elected leader per ledger sweeps
(recovery, orphaned calls, deadlines), ends OpenAI-compatible batches, packs and follows the
batch tier's provider batches, and purges (retention); one deliverer sends the outbound
callbacks; and each process watches for peers that share its ledger without sharing its
limits."""

from __future__ import annotations

import asyncio
import itertools
import logging

from floodway.clock import stop_task
from floodway.core.errors import StoreError
from floodway.core.owners import owner_name
from floodway.maintenance.leader import lead
from floodway.maintenance.limits_watch import LocalLimitsWatch
from floodway.maintenance.openai_batches import BatchEnder
from floodway.maintenance.outbox import Outbox
from floodway.maintenance.sweeper import Sweeper
from floodway.maintenance.tier_batches import Batcher
from floodway.runtime import Runtime
from floodway.store.base import Purged, Retention

log = logging.getLogger("floodway.maintenance")

LEADER_NAME = "maintenance"


class Retainer:
    """Results and errors expire and rows are purged (``[retention]``); request keys carry
    their own expiry from their insert."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def run_once(self) -> Purged:
        r = self.runtime.settings.retention
        return await self.runtime.store.purge(
            Retention(self.runtime.clock.now(), r.results, r.rows)
        )


class Maintenance:
    _numbers = itertools.count(1)

    def __init__(
        self,
        runtime: Runtime,
        *,
        sweep_every_s: float = 1.0,
        purge_every_s: float = 60.0,
        workers: tuple[str, ...] = (),
    ) -> None:
        self.runtime = runtime
        self.sweeper = Sweeper(runtime)
        self.retainer = Retainer(runtime)
        self.outbox = Outbox(runtime)
        self.batches = BatchEnder(runtime)
        self.tier_batches = Batcher(runtime)
        self.watch = LocalLimitsWatch(runtime, workers)
        self.sweep_every_s = sweep_every_s
        self.purge_every_s = purge_every_s
        self.owner = owner_name(runtime.store.identity, f"m{next(self._numbers)}")
        self._task: asyncio.Task[None] | None = None
        self.is_leader = False

    async def tick(self) -> bool:
        """One round if we lead (or become leader); True if we did the work."""
        runtime = self.runtime
        now = runtime.clock.now()
        self.is_leader = await lead(
            runtime.store, LEADER_NAME, self.owner, now, self.sweep_every_s * 5
        )
        if self.is_leader:
            await self.sweeper.run_once()
            await self.batches.run_once()
            await self.tier_batches.run_once()
        return self.is_leader

    async def _run(self) -> None:
        last_purge = float("-inf")
        while True:
            try:
                if await self.tick() and (
                    self.runtime.clock.now() - last_purge >= self.purge_every_s
                ):
                    last_purge = self.runtime.clock.now()
                    await self.retainer.run_once()
            except StoreError as exc:
                self.sweeper.ledger_unavailable()
                log.warning("maintenance round failed, the ledger is out: %s", exc)
            except Exception:
                log.exception("maintenance round failed")
            await self.runtime.clock.sleep(self.sweep_every_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="floodway-maintenance")
        self.outbox.start()
        self.watch.start()

    async def stop(self) -> None:
        await self.watch.stop()
        await self.outbox.stop()
        await stop_task(self._task)
