"""Group the outcomes that finish together into one ``store.complete`` call.

Every write is still its own compare-and-set; batching only shares the transaction (and its
commit), which is most of the cost of a short task on PostgreSQL.
"""

from __future__ import annotations

import asyncio

from floodway.clock import Clock
from floodway.core.outcome import Applied, Completion
from floodway.store.base import Store


class Completer:
    def __init__(self, store: Store, clock: Clock, max_batch: int = 256) -> None:
        self._store = store
        self._clock = clock
        self._max_batch = max_batch
        self._pending: list[tuple[Completion, asyncio.Future[Applied]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def write(self, item: Completion) -> Applied:
        """Queue one write; resolves when the batch that carries it has committed."""
        fut: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="floodway-completer")
        return await fut

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # one loop tick: let the outcomes finishing now join the batch
        while self._pending:
            batch, self._pending = (
                self._pending[: self._max_batch],
                self._pending[self._max_batch :],
            )
            try:
                results = await self._store.complete([item for item, _ in batch], self._clock.now())
            except Exception as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), applied in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(applied)
