"""Operations: ``/v1/stats``, ``/metrics``, ``/healthz`` and the dashboard at ``/``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse, HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from floodway.api.auth import Operator, Who
from floodway.api.metrics import resource_snapshot
from floodway.api.openapi import problems
from floodway.api.problems import ApiProblem
from floodway.api.schemas import HealthOut, StatsOut, TimingOut
from floodway.api.state import ApiState, api_state
from floodway.api.stats import Timing
from floodway.version import __version__

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
    fw = state.fw
    tenant = None if who.operator else who.tenant
    counts = await fw.store.stats(tenant)
    window = await state.recent.window(fw.store, tenant)
    return StatsOut(
        tasks=dict(counts.by_status),
        by_kind={k: dict(v) for k, v in counts.by_kind_status.items()},
        window=len(window.tasks),
        queue_wait=_timing(window.queue_wait()),
        completion=_timing(window.completion()),
        retries=window.retries(),
        retrying=counts.by_status.get("retrying", 0),
        dead_letters=counts.by_status.get("dead", 0),
        resources=await resource_snapshot(fw.runtime) if who.operator else {},
        upstream=fw.runtime.upstream.as_dict() if who.operator else {},
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
    return HealthOut(status="ok", version=__version__)


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
