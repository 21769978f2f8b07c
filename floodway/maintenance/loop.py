"""The maintenance services, run by one elected leader at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from floodway.core.task import new_token
from floodway.maintenance.sweeper import Sweeper
from floodway.runtime import Runtime
from floodway.store.base import Purged, Retention

log = logging.getLogger("floodway.maintenance")


class Retainer:
    """Results and errors expire, rows are purged, request keys expire."""

    def __init__(self, runtime: Runtime, results_s: float, rows_s: float, keys_s: float) -> None:
        self.runtime = runtime
        self.results_s, self.rows_s, self.keys_s = results_s, rows_s, keys_s

    async def run_once(self) -> Purged:
        return await self.runtime.store.purge(
            Retention(self.runtime.clock.now(), self.results_s, self.rows_s, self.keys_s)
        )


class Maintenance:
    def __init__(
        self,
        runtime: Runtime,
        *,
        sweep_every_s: float = 1.0,
        purge_every_s: float = 60.0,
        results_s: float = 7 * 86400,
        rows_s: float = 30 * 86400,
        keys_s: float = 24 * 3600,
        owner: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.sweeper = Sweeper(runtime)
        self.retainer = Retainer(runtime, results_s, rows_s, keys_s)
        self.sweep_every_s = sweep_every_s
        self.purge_every_s = purge_every_s
        self.owner = owner or f"maint-{new_token()[:8]}"
        self._task: asyncio.Task[None] | None = None
        self.is_leader = False

    async def tick(self) -> bool:
        """One round if we lead (or become leader); True if we did the work."""
        runtime = self.runtime
        self.is_leader = await runtime.store.try_lead(
            "maintenance", self.owner, runtime.clock.now(), self.sweep_every_s * 5
        )
        if self.is_leader:
            await self.sweeper.run_once()
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
            except Exception:
                log.exception("maintenance round failed")
            await self.runtime.clock.sleep(self.sweep_every_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="floodway-maintenance")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
