"""Prometheus metrics, on a registry owned by one app (never the process-global default, so two
apps in one process, as in tests, do not collide)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from floodway.api.stats import Observed, Window
from floodway.runtime import Runtime
from floodway.store.base import SpendReport, StoreStats

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class _Snapshot(Collector):
    """Gauges read at scrape time (task counts, limiter state), filled in just before."""

    def __init__(self) -> None:
        self.by_status: dict[str, int] = {}
        self.resources: dict[str, dict[str, Any]] = {}
        self.upstream: dict[str, float] = {}
        self.callbacks_out: dict[str, int] = {}
        self.spend: SpendReport = SpendReport()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        tasks = GaugeMetricFamily(
            "floodway_tasks", "Tasks in the ledger by status", labels=["status"]
        )
        for status, count in sorted(self.by_status.items()):
            tasks.add_metric([status], count)
        yield tasks
        fields = {
            "in_flight": "Requests in flight to the resource",
            "concurrency": "Current concurrency cap of the resource (0 = none)",
            "rate_factor": "Requests rate in force over the configured one (1 = configured)",
            "paused_for": "Seconds until the resource admits again after a 429 pause",
            "throttles": "429 answers this process has seen from the resource",
            "throttles_limit": "429s this process judged a limit (pause, lower the estimate)",
            "throttles_noise": "429s this process judged noise (only the refused task waited)",
            "pauses": "Pauses of the whole resource this process imposed",
            "sending_per_min": "Requests sent to the resource lately, per minute, fleet-wide",
        }
        for field, doc in fields.items():
            family = GaugeMetricFamily(f"floodway_resource_{field}", doc, labels=["resource"])
            for name, snap in sorted(self.resources.items()):
                value = snap.get(field)
                if isinstance(value, int | float):
                    family.add_metric([name], float(value))
            yield family
        yield from self._limits()
        for key, value in sorted(self.upstream.items()):
            yield GaugeMetricFamily(
                f"floodway_upstream_{key}", f"provider {key} seen by this process", value=value
            )
        out = CounterMetricFamily(
            "floodway_webhooks_out",
            "Outbound task callbacks this process delivered, retried or gave up on",
            labels=["result"],
        )
        for result, count in sorted(self.callbacks_out.items()):
            out.add_metric([result], count)
        yield out
        yield from self._spend()

    def _spend(self) -> Iterator[CounterMetricFamily]:
        # Read from the ledger: the same figures from every process, kept across restarts.
        spent = CounterMetricFamily(
            "floodway_spend",
            "What billed calls cost at the configured prices (the spend ledger)",
            labels=["tenant", "kind"],
        )
        saved = CounterMetricFamily(
            "floodway_spend_saved",
            "What dedupe saved: the cost of the work deduped tasks took the result of",
            labels=["tenant", "kind"],
        )
        for line in self.spend.lines:
            spent.add_metric([line.tenant, line.kind], line.cost)
            saved.add_metric([line.tenant, line.kind], line.saved)
        yield spent
        yield saved

    def _limits(self) -> Iterator[GaugeMetricFamily]:
        limit = GaugeMetricFamily(
            "floodway_resource_limit",
            "Limit in force per dimension (slots; requests or tokens per minute) and its source "
            "(configured, header: the provider's rate-limit headers, learned)",
            labels=["resource", "dimension", "source"],
        )
        held = GaugeMetricFamily(
            "floodway_resource_held_back",
            "Candidates the last admission pass held back, by what held them (concurrency, "
            "requests, tokens, pause, tenant cap, recovering)",
            labels=["resource", "reason"],
        )
        for name, snap in sorted(self.resources.items()):
            for dimension, value in sorted((snap.get("limits") or {}).items()):
                if isinstance(value, dict) and isinstance(value.get("value"), int | float):
                    limit.add_metric([name, dimension, str(value.get("source"))], value["value"])
            for reason, count in sorted((snap.get("held_back_by") or {}).items()):
                if isinstance(count, int | float):
                    held.add_metric([name, reason], float(count))
        yield limit
        yield held


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.responses = Counter(
            "floodway_api_responses",
            "HTTP responses of the API by status code",
            ["code"],
            registry=self.registry,
        )
        self.webhooks_in = Counter(
            "floodway_webhooks_in",
            "Inbound provider callbacks by result",
            ["result"],
            registry=self.registry,
        )
        self.completion = Histogram(
            "floodway_task_completion_seconds",
            "Submit to success, for tasks that succeeded",
            ["kind"],
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "floodway_task_queue_wait_seconds",
            "Submit to first start",
            ["kind"],
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.finished = Counter(
            "floodway_tasks_finished",
            "Tasks that reached a terminal status, by status and error type",
            ["status", "error_type"],
            registry=self.registry,
        )
        self._snapshot = _Snapshot()
        self.registry.register(self._snapshot)
        self._observed = Observed()

    def observe_window(self, window: Window) -> None:
        for task in self._observed.new_finished(window.tasks):
            self.finished.labels(task.status.value, task.error_type).inc()
            if task.finished_at is not None and task.status.value == "succeeded":
                self.completion.labels(task.kind).observe(
                    max(0.0, task.finished_at - task.created_at)
                )
            if task.started_at is not None:
                self.queue_wait.labels(task.kind).observe(
                    max(0.0, task.started_at - task.created_at)
                )

    def render(
        self,
        stats: StoreStats,
        spend: SpendReport,
        resources: Mapping[str, dict[str, Any]],
        window: Window,
        upstream: Mapping[str, float] | None = None,
        callbacks_out: Mapping[str, int] | None = None,
    ) -> bytes:
        self._snapshot.by_status = dict(stats.by_status)
        self._snapshot.spend = spend
        self._snapshot.resources = dict(resources)
        self._snapshot.upstream = dict(upstream or {})
        self._snapshot.callbacks_out = dict(callbacks_out or {})
        self.observe_window(window)
        return generate_latest(self.registry)


async def resource_snapshot(runtime: Runtime) -> dict[str, dict[str, Any]]:
    """The limiter's per-resource state, when the admission in use can report one."""
    snapshots = await runtime.admission.snapshot()
    return {name: _finite(dataclasses.asdict(snap)) for name, snap in snapshots.items()}


def _finite(data: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity (an unbounded wait, say): report it as null rather than fail."""
    clean: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            value = _finite(value)
        elif isinstance(value, float) and not math.isfinite(value):
            value = None
        clean[key] = value
    return clean
