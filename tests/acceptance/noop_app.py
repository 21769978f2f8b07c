"""A floodway app with one fast, no-op kind that is not idempotent, for killing a worker in
the middle of a fast drain. Run it with ``floodway worker --app tests.acceptance.noop_app:fw``
(env FLOODWAY_DATABASE)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from floodway import Context, Floodway

#: how long a call of ``noop`` may run: a lost worker's calls are waited for this long
CALL_TIMEOUT_S = 1.0


def build(database: str | None = None) -> Floodway:
    fw = Floodway(database=database or os.environ.get("FLOODWAY_DATABASE"))

    @fw.kind("noop", dedupe=False, timeout=CALL_TIMEOUT_S)
    async def noop(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.001)  # a call that returns at once
        return {"n": value["n"]}

    return fw


fw = build() if os.environ.get("FLOODWAY_DATABASE") else None
