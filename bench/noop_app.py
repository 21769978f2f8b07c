"""A floodway app with one no-op kind, for throughput runs in worker processes.

``budgeted`` (env ``FLOODWAY_BENCH_BUDGETED=1`` in worker processes): the kind is priced, its
handler reports usage, and every tenant has a budget too large to refuse anything, so a run
measures what the spend ledger and the budget check cost, not refusals.
"""

from __future__ import annotations

import os
from typing import Any

from floodway import Context, Floodway
from floodway.config import BudgetConfig, PriceConfig, ResourceConfig, Settings, TenantConfig

RESOURCE = "bench"


def build(database: str | None = None, *, budgeted: bool | None = None) -> Floodway:
    database = database or os.environ.get("FLOODWAY_DATABASE")
    if budgeted is None:
        budgeted = os.environ.get("FLOODWAY_BENCH_BUDGETED") == "1"
    if budgeted:
        settings = Settings(
            database=database,
            resources={RESOURCE: ResourceConfig(price=PriceConfig(per_request=0.0001))},
            tenants=TenantConfig(budget=BudgetConfig(amount=1e12)),
        )
        fw = Floodway(settings=settings)
    else:
        fw = Floodway(database=database)

    @fw.kind("noop", dedupe=False, deadline=None, resource=RESOURCE if budgeted else None)
    async def noop(ctx: Context, value: dict[str, Any]) -> None:
        if budgeted:
            ctx.report_usage(1)  # one billed call: a spend row with the completion
        return None

    return fw


fw = build() if os.environ.get("FLOODWAY_DATABASE") else None


async def noop(ctx: Context, value: dict[str, Any]) -> None:
    """The same no-op as a ``handler = "bench.noop_app:noop"`` for a kind in a config file."""
    return None
