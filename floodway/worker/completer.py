"""Group the outcomes that finish together into one ``store.complete`` call.

Every write is still its own compare-and-set; batching only shares the transaction (and its
commit), which is most of the cost of a short task on PostgreSQL.

An outcome that freed a provider slot lets the claim of the task taking that slot reach the
ledger first: written ahead of it, the outcome (a job's next step, a waiter's result) would
keep the slot idle while the one writer runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from floodway.clock import Clock
from floodway.core.outcome import Applied, Completion
from floodway.store.base import Store

#: the longest an outcome waits for a hand-off's claim (real time, a safety net: the
#: dispatcher opens the way as soon as it has queued the claim or found nothing to claim)
CLAIM_FIRST_WAIT_S = 0.01


class Completer:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        max_batch: int = 256,
        claims_first: Callable[[], asyncio.Future[None] | None] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._max_batch = max_batch
        #: a future while a provider slot freed before the outcomes waits for its claim
        self._claims_first = claims_first
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
            await self._after_hand_off()
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

    async def _after_hand_off(self) -> None:
        """Until the slots the pending outcomes freed are handed on: outcomes that come
        meanwhile join the batch, and so the wait, up to CLAIM_FIRST_WAIT_S in all."""
        if self._claims_first is None:
            return
        loop = asyncio.get_running_loop()
        give_up = loop.time() + CLAIM_FIRST_WAIT_S
        while (handed_on := self._claims_first()) is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(handed_on, give_up - loop.time())
            if loop.time() >= give_up:
                return
