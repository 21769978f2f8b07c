"""Timings over the newest tasks, for ``GET /v1/stats`` and the histograms of ``/metrics``;
what a tenant's view of the limits holds."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from floodway.api.schemas import CapOut
from floodway.app import Floodway
from floodway.config import Settings, parse_rate
from floodway.core.states import Status
from floodway.kinds import KindRegistry
from floodway.store.base import StoreStats, TaskTiming


@dataclass(frozen=True)
class Timing:
    count: int
    mean_s: float | None
    p50_s: float | None
    p95_s: float | None


@dataclass(frozen=True)
class Window:
    tasks: tuple[TaskTiming, ...]

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
    """The newest ``size`` tasks of the ledger, or of one tenant: their timings only."""

    def __init__(self, size: int = 500) -> None:
        self.size = size

    async def window(self, fw: Floodway, tenant: str | None = None) -> Window:
        newest = await fw.recent_timings(tenant=tenant, limit=self.size)
        return Window(tuple(reversed(newest)))


class Observed:
    """Remembers which finished tasks were already counted into the histograms."""

    def __init__(self, size: int = 5000) -> None:
        self.size = size
        self._seen: OrderedDict[str, None] = OrderedDict()

    def new_finished(self, tasks: Sequence[TaskTiming]) -> list[TaskTiming]:
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


#: what a tenant is shown of a shared resource's snapshot: its limits and state, never a
#: figure summed over other tenants' tasks (in flight, sent, 429s, bucket levels)
SHARED_FIELDS = ("concurrency", "limits", "paused_for", "next_admission_in")


def tenant_resources(
    kinds: KindRegistry,
    tenant: str,
    counts: StoreStats,
    snapshots: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """The resources the tenant's kinds use, as the tenant may see them: each one's limits in
    force, and the tenant's own use of them (its tasks in flight, and what held its own
    candidates back in the last admission pass)."""
    kinds_of: dict[str, list[str]] = {}
    for kind in sorted(counts.by_kind_status):
        if kind in kinds:
            resource = kinds.get(kind).resource
            if resource is not None and resource in snapshots:
                kinds_of.setdefault(resource, []).append(kind)
    view: dict[str, dict[str, Any]] = {}
    for name, used_by in kinds_of.items():
        snap = snapshots[name]
        view[name] = {
            **{key: snap.get(key) for key in SHARED_FIELDS},
            "kinds": used_by,
            "in_flight": sum(counts.by_kind_status[k].get("running", 0) for k in used_by),
            "held_back_by": dict((snap.get("held_back_by_tenant") or {}).get(tenant, {})),
        }
    return view


def tenant_caps(settings: Settings, counts: StoreStats) -> dict[str, CapOut]:
    """The caps every tenant has that are set (the budget is /v1/spend's): ``limit`` and,
    where the ledger knows it, the tenant's ``use``."""
    config = settings.tenants
    caps: dict[str, CapOut] = {}
    if config.concurrency:
        running = counts.by_status.get(Status.RUNNING.value, 0)
        caps["concurrency"] = CapOut(limit=config.concurrency, use=running, unit="in flight")
    if config.interactive_depth:
        caps["interactive_depth"] = CapOut(
            limit=config.interactive_depth, unit="interactive tasks queued or running"
        )
    if config.submit_rate:
        count, per_s = parse_rate(config.submit_rate)
        caps["submit_rate"] = CapOut(limit=count / per_s, unit="submits per second")
    return caps
