"""Recent ``/v1/stats`` answers, kept in memory by the API process so the dashboard's charts
open with the last minutes drawn instead of empty.

A task of the app's lifespan takes one sample every ``interval_s`` (5 s: the charts' rates
are differences between samples, and their lines break at gaps over 15 s) and keeps the last
``size`` (15 minutes). A sample costs what one dashboard poll costs; samples are per process,
lost on restart, and a sample the ledger could not answer is skipped, not fatal.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar

from floodway.clock import Clock, stop_task
from floodway.core.errors import FloodwayError

log = logging.getLogger("floodway.api")

T = TypeVar("T")
SAMPLE_INTERVAL_S = 5.0
KEPT_S = 15 * 60.0


@dataclass(frozen=True)
class Sample(Generic[T]):
    at: float  # epoch seconds
    value: T


class History(Generic[T]):
    """``async with History(take, clock):`` samples ``take()`` until the block ends."""

    def __init__(
        self,
        take: Callable[[], Awaitable[T]],
        clock: Clock,
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        kept_s: float = KEPT_S,
    ) -> None:
        self.take = take
        self.clock = clock
        self.interval_s = interval_s
        self._samples: deque[Sample[T]] = deque(maxlen=max(1, round(kept_s / interval_s)))
        self._task: asyncio.Task[None] | None = None

    def samples(self) -> list[Sample[T]]:
        return list(self._samples)

    async def _run(self) -> None:
        while True:
            try:
                self._samples.append(Sample(self.clock.now(), await self.take()))
            except FloodwayError as exc:  # the ledger is down: the gap shows in the chart
                log.debug("stats sample skipped: %s", exc)
            except Exception:  # a bug: say so, and keep sampling (and serving)
                log.exception("stats sample failed")
            await self.clock.sleep(self.interval_s)

    async def __aenter__(self) -> History[T]:
        self._task = asyncio.create_task(self._run(), name="floodway-stats-history")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await stop_task(self._task)
