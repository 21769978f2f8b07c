"""A floodway app with one no-op kind, for throughput runs in worker processes."""

from __future__ import annotations

import os
from typing import Any

from floodway import Context, Floodway


def build(database: str | None = None) -> Floodway:
    fw = Floodway(database=database or os.environ.get("FLOODWAY_DATABASE"))

    @fw.kind("noop", dedupe=False, deadline_s=None)
    async def noop(ctx: Context, value: dict[str, Any]) -> None:
        return None

    return fw


fw = build() if os.environ.get("FLOODWAY_DATABASE") else None


async def noop(ctx: Context, value: dict[str, Any]) -> None:
    """The same no-op as a ``handler = "bench.noop_app:noop"`` for a kind in a config file."""
    return None
