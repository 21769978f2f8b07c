"""Timings over the newest tasks, for ``GET /v1/stats`` and the histograms of ``/metrics``."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from floodway.app import Floodway
from floodway.core.states import Status
from floodway.core.task import Task
from floodway.store.base import TaskQuery


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
    """The newest ``size`` tasks of the ledger, or of one tenant."""

    def __init__(self, size: int = 500) -> None:
        self.size = size

    async def window(self, fw: Floodway, tenant: str | None = None) -> Window:
        query = TaskQuery(tenant=tenant, descending=True, limit=self.size)
        return Window(tuple(reversed(await fw.list_tasks(query))))


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
