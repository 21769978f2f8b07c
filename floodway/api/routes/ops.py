"""Operations: ``/v1/stats``, ``/metrics``, ``/healthz``, ``/readyz`` and the dashboard at ``/``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import FileResponse, HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from floodway.api.auth import Operator, Who
from floodway.api.health import ReadyOut, check_dependencies
from floodway.api.metrics import resource_snapshot
from floodway.api.openapi import problems
from floodway.api.problems import ApiProblem
from floodway.api.schemas import (
    HealthOut,
    SpendTotalOut,
    StatsHistoryOut,
    StatsOut,
    StatsSample,
    TimingOut,
    WorkerOut,
    WorkersOut,
    WorkerTaskOut,
)
from floodway.api.state import ApiState, api_state
from floodway.api.stats import Timing, tenant_caps, tenant_resources
from floodway.store.base import SpendQuery, SpendReport
from floodway.version import __version__
from floodway.wire.tasks import timestamp
from floodway.worker.worker import WORKER_BEAT_S

router = APIRouter(tags=["operations"])
State = Annotated[ApiState, Depends(api_state)]

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard" / "static" / "index.html"

_FALLBACK_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>floodway</title></head>
<body><h1>floodway</h1>
<p>The API is up. See <a href="/docs">/docs</a> for the interactive API reference,
<a href="/v1/stats">/v1/stats</a> and <a href="/metrics">/metrics</a>.</p>
</body></html>
"""


def _timing(t: Timing) -> TimingOut:
    return TimingOut(count=t.count, mean_s=t.mean_s, p50_s=t.p50_s, p95_s=t.p95_s)


@router.get(
    "/v1/stats", response_model=StatsOut, summary="Ledger statistics", responses=problems(401)
)
async def stats(who: Who, state: State) -> StatsOut:
    """Counts per status and timings over the newest tasks: the caller's tenant's, or, for an
    operator key (or an open API), every tenant's with the limiter's and the providers' state
    (which says how busy everyone is)."""
    return await stats_snapshot(state, None if who.operator else who.tenant)


async def stats_snapshot(state: ApiState, tenant: str | None = None) -> StatsOut:
    """What ``GET /v1/stats`` answers one tenant, or (None) an operator."""
    fw = state.fw
    counts = await fw.stats(tenant=tenant)
    window = await state.recent.window(fw, tenant)
    snapshots = await resource_snapshot(fw.runtime)
    return StatsOut(
        tenant=tenant,
        tasks=dict(counts.by_status),
        by_kind={k: dict(v) for k, v in counts.by_kind_status.items()},
        window=len(window.tasks),
        queue_wait=_timing(window.queue_wait()),
        completion=_timing(window.completion()),
        retries=window.retries(),
        retrying=counts.by_status.get("retrying", 0),
        dead_letters=counts.by_status.get("dead", 0),
        resources=snapshots
        if tenant is None
        else tenant_resources(fw.runtime.kinds, tenant, counts, snapshots),
        caps={} if tenant is None else tenant_caps(state.settings, counts),
        upstream=fw.runtime.upstream_counts.as_dict() if tenant is None else {},
        spend=_spend_total(await fw.spend(SpendQuery(since=0.0, tenant=tenant))),
    )


async def stats_views(state: ApiState) -> dict[str | None, StatsOut]:
    """What ``GET /v1/stats`` answers an operator (None) and each tenant an API key maps to:
    one sample of the history (a tenant's charts open drawn, from its own figures only)."""
    api = state.settings.api
    tenants = sorted({*api.keys.values(), *api.admin_keys.values()})
    views: dict[str | None, StatsOut] = {None: await stats_snapshot(state)}
    for tenant in tenants:
        views[tenant] = await stats_snapshot(state, tenant)
    return views


def _spend_total(report: SpendReport) -> SpendTotalOut:
    by_kind: dict[str, dict[str, float]] = {}
    for line in report.lines:
        kind = by_kind.setdefault(line.kind, {"cost": 0.0, "saved": 0.0})
        kind["cost"] += line.cost
        kind["saved"] += line.saved
    return SpendTotalOut(
        cost=sum(line.cost for line in report.lines),
        saved=sum(line.saved for line in report.lines),
        by_kind=by_kind,
    )


@router.get(
    "/v1/stats/history",
    response_model=StatsHistoryOut,
    summary="Recent /v1/stats answers",
    responses=problems(401),
)
async def stats_history(who: Who, state: State) -> StatsHistoryOut:
    """What ``/v1/stats`` answered the caller over the last minutes (an operator's view, or
    the caller's tenant's), sampled by this API process: the dashboard draws its charts from
    them when it opens. Empty on a fresh process."""
    history = state.history
    view = None if who.operator else who.tenant
    samples = history.samples() if history is not None else []
    return StatsHistoryOut(
        now=timestamp(state.fw.clock.now()) or datetime.now(UTC),
        interval_s=history.interval_s if history is not None else 0.0,
        samples=[
            StatsSample(at=timestamp(s.at) or datetime.now(UTC), stats=s.value[view])
            for s in samples
            if view in s.value
        ],
    )


#: workers silent for longer are not listed
WORKERS_SEEN_S = 600.0


@router.get(
    "/v1/workers",
    response_model=WorkersOut,
    summary="The workers of every process (an operator key when keys are configured)",
    responses=problems(401, 403),
)
async def workers(_: Operator, state: State) -> WorkersOut:
    """Each worker heard from in the last 10 minutes: host, pid, concurrency, kinds, its last
    heartbeat, and the tasks it holds now (every tenant's: operators only)."""
    now = state.fw.clock.now()
    found = await state.fw.workers(now - WORKERS_SEEN_S)
    epoch0 = datetime.fromtimestamp(0, UTC)
    return WorkersOut(
        now=timestamp(now) or datetime.now(UTC),
        workers=[
            WorkerOut(
                id=w.owner,
                host=w.host,
                pid=w.pid,
                concurrency=w.concurrency,
                kinds=list(w.kinds),
                started_at=timestamp(w.started_at) or epoch0,
                heartbeat_at=timestamp(w.heartbeat_at) or epoch0,
                heartbeat_age_s=max(0.0, now - w.heartbeat_at),
                silent=now - w.heartbeat_at > 3 * WORKER_BEAT_S,
                tasks=[
                    WorkerTaskOut(
                        id=t.task_id,
                        kind=t.kind,
                        tenant=t.tenant,
                        attempt=t.attempt,
                        since=timestamp(t.since),
                    )
                    for t in w.tasks
                ],
            )
            for w in found
        ],
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics (an operator key when keys are configured)",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **problems(401, 403),
    },
)
async def metrics(_: Operator, state: State) -> Response:
    return await render_metrics(state)


async def render_metrics(state: ApiState) -> Response:
    """Every tenant's counts, the limiter's and the providers' state: the operator's view."""
    fw = state.fw
    body = state.metrics.render(
        await fw.stats(),
        await fw.spend(SpendQuery(since=0.0)),
        await resource_snapshot(fw.runtime),
        await state.recent.window(fw),
        fw.runtime.upstream_counts.as_dict(),
        fw.runtime.callbacks_out,
    )
    return Response(body, media_type=CONTENT_TYPE_LATEST)


VerboseOpt = Annotated[
    str | None,
    Query(description="present (and not `0` or `false`): also report each dependency"),
]


@router.get(
    "/healthz",
    response_model=HealthOut,
    response_model_exclude_none=True,
    summary="Liveness",
    responses=problems(),
)
async def healthz(state: State, verbose: VerboseOpt = None) -> HealthOut:
    """200 while the process serves: cheap, for a liveness probe (it looks at nothing else).
    With ``?verbose=1`` it also reports each dependency, as ``/readyz`` does, still with 200."""
    checks = None
    if verbose is not None and verbose.lower() not in ("0", "false"):
        checks = {name: c.model_dump() for name, c in (await check_dependencies(state)).items()}
    return HealthOut(status="ok", version=__version__, checks=checks)


@router.head("/healthz", include_in_schema=False)
async def healthz_head() -> Response:
    return Response(status_code=200)


@router.get(
    "/readyz",
    response_model=ReadyOut,
    summary="Readiness: every dependency answers",
    responses=problems(),
)
async def readyz(state: State) -> ReadyOut:
    """Each dependency (the ledger; the limiter's Redis when ``redis`` is set) looked at once,
    with its latency. 503 when one is down: a load balancer should send this process no
    traffic until it answers again (floodway keeps retrying on its own)."""
    checks = await check_dependencies(state)
    down = [name for name, check in checks.items() if check.status != "ok"]
    if down:
        raise ApiProblem(
            503,
            "dependency-unavailable",
            "; ".join(f"{name} ({checks[name].target}): {checks[name].detail}" for name in down),
            headers={"Retry-After": "1"},
            checks={name: check.model_dump() for name, check in checks.items()},
        )
    return ReadyOut(status="ok", version=__version__, checks=checks)


@router.head("/readyz", include_in_schema=False)
async def readyz_head(state: State) -> Response:
    checks = await check_dependencies(state)
    ready = all(check.status == "ok" for check in checks.values())
    return Response(status_code=200 if ready else 503)


@router.get(
    "/",
    summary="Dashboard",
    response_class=HTMLResponse,
    responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}, **problems()},
)
async def dashboard() -> Response:
    if DASHBOARD.is_file():
        return FileResponse(DASHBOARD, media_type="text/html")
    return HTMLResponse(_FALLBACK_PAGE)
