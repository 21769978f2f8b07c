"""A floodway app whose one kind calls the simulated provider over HTTP: run it with
``floodway worker --app tests.acceptance.sim_app:fw`` (env FLOODWAY_DATABASE, SIM_URL)."""

from __future__ import annotations

import os
from typing import Any

import httpx

from floodway import Context, FatalError, Floodway, RetryableError


def build(database: str | None = None, sim_url: str | None = None) -> Floodway:
    fw = Floodway(database=database or os.environ.get("FLOODWAY_DATABASE"))
    base = sim_url or os.environ.get("SIM_URL", "http://127.0.0.1:9000")
    client: dict[str, httpx.AsyncClient] = {}

    def http() -> httpx.AsyncClient:
        if "c" not in client:
            client["c"] = httpx.AsyncClient(base_url=base, timeout=10)
        return client["c"]

    async def lookup(ctx: Context) -> Any:
        r = await http().get("/jobs", params={"idempotency_key": ctx.work_key})
        return r.json().get("result") if r.status_code == 200 else None

    @fw.kind("img", idempotent=True, lookup=lookup)
    async def generate(ctx: Context, value: dict[str, Any]) -> Any:
        r = await http().post("/generate", json=value, headers={"Idempotency-Key": ctx.work_key})
        if r.status_code == 429 or r.status_code >= 500 or r.status_code == 409:
            raise RetryableError(
                f"HTTP {r.status_code}",
                throttled=r.status_code == 429,
                in_progress=r.status_code == 409,
            )
        if r.status_code >= 400:
            raise FatalError(r.text)
        return r.json()["result"]

    return fw


fw = build() if os.environ.get("FLOODWAY_DATABASE") else None
