"""Timings over the newest tasks, for ``GET /v1/stats`` and the histograms of ``/metrics``.

The store answers counts per status but has no verb for "the newest tasks". Its keyset listing
(ordered by ``seq``) can still find them: we gallop from the last tail we saw to the current
one with one-row probes (a primary-key seek each), then read the last ``window`` rows. After the
first call the gallop is a probe or two, so a dashboard polling every second costs one page read.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from floodway.core.states import Status
from floodway.core.task import Task
from floodway.store.base import Store, TaskQuery


@dataclass(frozen=True)
class Timing:
    count: int
    mean_s: float | None
    p50_s: float | None
    p95_s: float | None


@dataclass(frozen=True)
class Window:
    tasks: tuple[Task, ...]

    def queue_wait(self) -> Timing:
        """Submit to first start, over the tasks that have started."""
        return summarize(
            t.started_at - t.created_at for t in self.tasks if t.started_at is not None
        )

    def completion(self) -> Timing:
        """Submit to success, over the tasks that succeeded."""
        return summarize(
            t.finished_at - t.created_at
            for t in self.tasks
            if t.status is Status.SUCCEEDED and t.finished_at is not None
        )

    def retries(self) -> int:
        return sum(max(0, t.attempts - 1) for t in self.tasks)


def summarize(values: Iterable[float]) -> Timing:
    data = sorted(max(0.0, v) for v in values if math.isfinite(v))
    if not data:
        return Timing(0, None, None, None)

    def rank(p: float) -> float:  # nearest-rank percentile
        return data[max(1, math.ceil(p * len(data))) - 1]

    return Timing(len(data), sum(data) / len(data), rank(0.50), rank(0.95))


class Recent:
    """Reads the newest ``size`` tasks of the ledger (all tenants)."""

    def __init__(self, size: int = 500) -> None:
        self.size = size
        self._tail = 0  # the highest seq seen so far: seqs only grow

    async def window(self, store: Store) -> Window:
        tail = await self._find_tail(store)
        if tail == 0:
            return Window(())
        start = max(0, tail - self.size)
        tasks = await store.list_tasks(TaskQuery(after_seq=start, limit=self.size))
        return Window(tuple(tasks))

    async def _find_tail(self, store: Store) -> int:
        async def next_after(seq: int) -> int | None:
            found = await store.list_tasks(TaskQuery(after_seq=seq, limit=1))
            return found[0].seq if found else None

        low = self._tail  # no row after `high` is known yet; `low` is a seq that exists or 0
        step = 1
        while (seq := await next_after(low + step - 1)) is not None:
            low, step = seq, step * 2
        # The tail lies in [low, low + step): narrow it with one-row probes.
        high = low + step - 1
        while low < high:
            mid = (low + high + 1) // 2
            seq = await next_after(mid - 1)
            if seq is not None:
                low = seq
            else:
                high = mid - 1
        self._tail = low
        return low


class Observed:
    """Remembers which finished tasks were already counted into the histograms."""

    def __init__(self, size: int = 5000) -> None:
        self.size = size
        self._seen: OrderedDict[str, None] = OrderedDict()

    def new_finished(self, tasks: Sequence[Task]) -> list[Task]:
        fresh = []
        for task in tasks:
            if not task.terminal or task.finished_at is None:
                continue
            key = f"{task.id}@{task.finished_at}"  # a manual retry finishes again: count it
            if key in self._seen:
                continue
            self._seen[key] = None
            fresh.append(task)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)
        return fresh
