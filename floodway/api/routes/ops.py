"""Operations: ``/v1/stats``, ``/metrics``, ``/healthz`` and the dashboard at ``/``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse, HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import floodway
from floodway.api.auth import Tenant
from floodway.api.metrics import resource_snapshot
from floodway.api.openapi import problems
from floodway.api.problems import ApiProblem
from floodway.api.schemas import HealthOut, StatsOut, TimingOut
from floodway.api.state import ApiState, api_state
from floodway.api.stats import Timing

router = APIRouter(tags=["operations"])
State = Annotated[ApiState, Depends(api_state)]

DASHBOARD = Path(floodway.__file__).parent / "dashboard" / "static" / "index.html"

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
async def stats(tenant: Tenant, state: State) -> StatsOut:
    """Counts per status (all tenants: this is the operator's view and carries no task data),
    and timings over the newest tasks."""
    fw = state.fw
    counts = await fw.store.stats()
    window = await state.recent.window(fw.store)
    return StatsOut(
        tasks=dict(counts.by_status),
        by_kind={k: dict(v) for k, v in counts.by_kind_status.items()},
        window=len(window.tasks),
        queue_wait=_timing(window.queue_wait()),
        completion=_timing(window.completion()),
        retries=window.retries(),
        retrying=counts.by_status.get("retrying", 0),
        dead_letters=counts.by_status.get("dead", 0),
        resources=await resource_snapshot(fw.runtime),
        upstream=fw.runtime.upstream.as_dict(),
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **problems()},
)
async def metrics(state: State) -> Response:
    fw = state.fw
    body = state.metrics.render(
        await fw.store.stats(),
        await resource_snapshot(fw.runtime),
        await state.recent.window(fw.store),
        fw.runtime.upstream.as_dict(),
        fw.runtime.callbacks_out,
    )
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", response_model=HealthOut, summary="Liveness", responses=problems())
async def healthz(state: State) -> HealthOut:
    try:
        state.fw.runtime  # noqa: B018 - raises while the ledger is not open
    except RuntimeError:
        raise ApiProblem(503, "unavailable", "the ledger is not open") from None
    return HealthOut(status="ok", version=floodway.__version__)


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
