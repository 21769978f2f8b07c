"""``/v1/spend``: what billed calls cost, what dedupe saved, and what budgets have left."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from floodway.api.auth import Caller, Who
from floodway.api.openapi import problems
from floodway.api.problems import ApiProblem
from floodway.api.schemas import BudgetOut, SpendLineOut, SpendOut, SpendPointOut
from floodway.api.state import ApiState, api_state
from floodway.config import parse_duration
from floodway.store.base import SpendQuery
from floodway.wire.tasks import timestamp

router = APIRouter(tags=["spend"])
State = Annotated[ApiState, Depends(api_state)]

#: the most points a series has: a bucket too small for its window is widened
MAX_POINTS = 10_000
MAX_SPAN_S = 100 * 366 * 86400.0
#: a duration as the query takes it (what parse_duration reads, without spaces)
DURATION = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h|d)?$"

TenantOpt = Annotated[
    str | None,
    Query(description="one tenant (a tenant's key sees only its own; 404 for another)"),
]
KindOpt = Annotated[str | None, Query(description="one kind")]
SinceOpt = Annotated[
    str | None,
    Query(
        pattern=DURATION,
        description='how far back from now: "24h", "7d", "90m" (absent: everything kept)',
    ),
]
BucketOpt = Annotated[
    str,
    Query(
        pattern=DURATION,
        description='the series\' step, "1h", "1d"; widened to at most 10,000 points',
    ),
]


def _seconds(value: str) -> float:
    """A duration the pattern let through; anything past a century (an overflow to infinity
    included) means everything, which a century covers."""
    return min(parse_duration(value), MAX_SPAN_S)


def _tenant_in_view(who: Caller, tenant: str | None) -> str | None:
    """The tenant the caller may see: a tenant key only its own, whatever it asks for; an
    operator the one asked for, or (None) everyone."""
    if who.operator:
        return tenant
    if tenant is not None and tenant != who.tenant:
        # The same answer whether that tenant exists or not: tenants stay invisible.
        raise ApiProblem(404, "tenant-not-found", f"no tenant {tenant!r} for this key")
    return who.tenant


@router.get(
    "/v1/spend",
    response_model=SpendOut,
    summary="Spend per tenant and kind, dedupe savings and budgets",
    responses=problems(401, 404, 422),
)
async def spend(
    who: Who,
    state: State,
    tenant: TenantOpt = None,
    kind: KindOpt = None,
    since: SinceOpt = None,
    bucket: BucketOpt = "1h",
) -> SpendOut:
    """The spend ledger: billed calls priced at the configured prices, per tenant and kind,
    in total and per bucket of time; what dedupe saved; each budget's spent, held and left."""
    fw = state.fw
    now = fw.clock.now()
    view = _tenant_in_view(who, tenant)
    start = None if since is None else now - _seconds(since)
    # Everything kept spans the retention of finished rows, spend rows' too.
    span = now - start if start is not None else fw.settings.retention.rows
    bucket_s = max(_seconds(bucket), span / MAX_POINTS, 1.0)
    report = await fw.spend(
        SpendQuery(since=start or 0.0, tenant=view, kind=kind, bucket_s=bucket_s)
    )
    tenants = sorted({line.tenant for line in report.lines} | ({view} if view else set()))
    return SpendOut(
        since=timestamp(start),
        cost=sum(line.cost for line in report.lines),
        saved=sum(line.saved for line in report.lines),
        tier_saved=sum(line.tier_saved for line in report.lines),
        lines=[SpendLineOut(**vars(line)) for line in report.lines],
        bucket_s=bucket_s,
        series=[
            SpendPointOut(
                at=timestamp(p.at), tenant=p.tenant, kind=p.kind, cost=p.cost, saved=p.saved
            )
            for p in report.series
        ],
        budgets=[b for t in tenants if (b := await budget_view(state, t)) is not None],
    )


async def budget_view(state: ApiState, tenant: str) -> BudgetOut | None:
    fw = state.fw
    budget = fw.runtime.pricing.budget_of(tenant)
    if budget is None:
        return None
    now = fw.clock.now()
    start = budget.period_start(now)
    use = await fw.budget_use(tenant, start)
    return BudgetOut(
        tenant=tenant,
        amount=budget.amount,
        period_s=budget.period_s,
        period_start=timestamp(start),
        resets_at=timestamp(budget.resets_at(now)),
        spent=use.spent,
        held=use.held,
        left=max(0.0, budget.amount - use.spent - use.held),
    )
