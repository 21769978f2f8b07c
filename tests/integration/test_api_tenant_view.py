"""What a tenant sees of the limits that hold its work back (``GET /v1/stats``): its caps, and
the resources its kinds use with their limits and its own use of them, never a figure of
another tenant's tasks; and its own samples in ``/v1/stats/history``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from floodway.config import ResourceConfig
from floodway.context import Context
from tests.integration.conftest import StartApi, eventually

KEYS = {"key-a": "a", "key-b": "b"}
ADMIN = {"key-ops": "ops"}
#: what a tenant's view of a resource may hold: limits, and its own use of them
TENANT_FIELDS = {
    "concurrency",
    "limits",
    "paused_for",
    "next_admission_in",
    "kinds",
    "in_flight",
    "held_back_by",
}


@pytest.fixture
async def gates() -> AsyncIterator[dict[str, asyncio.Event]]:
    """A ``slow`` call waits until its input's gate is set (every gate is, at the end)."""
    found: dict[str, asyncio.Event] = {}
    yield found
    for gate in found.values():
        gate.set()


async def own_running(http: httpx.AsyncClient) -> int:
    page = (await http.get("/v1/tasks", params={"status": "running"})).json()
    return len(page["items"])


async def test_a_tenant_sees_the_limits_its_kinds_use_and_only_its_own_use(
    start_api: StartApi, gates: dict[str, asyncio.Event]
) -> None:
    async def slow(ctx: Context, inp: dict[str, Any]) -> dict[str, Any]:
        await gates.setdefault(inp["gate"], asyncio.Event()).wait()
        return {"ok": True}

    server = await start_api(
        keys=KEYS,
        api={"admin_keys": ADMIN},
        tenants={"concurrency": 5},
        resources={
            "llm": ResourceConfig(concurrency=2),
            "unused": ResourceConfig(concurrency=7),
        },
        configure=lambda fw, app: fw.kind("llm-call", resource="llm")(slow) and None,
    )
    a, b, ops = [await server.client(key) for key in ("key-a", "key-b", "key-ops")]

    async def submit(http: httpx.AsyncClient, gate: str) -> str:
        body = {"kind": "llm-call", "input": {"gate": gate, "n": uuid.uuid4().hex}}
        sent = await http.post("/v1/tasks", json=body)
        assert sent.status_code == 202
        return str(sent.json()["id"])

    # b fills the resource's two slots, a's tasks and more of b's queue behind them; when one
    # of b's calls ends, the admission pass that follows holds the rest back.
    first = await submit(b, "first")
    await submit(b, "later")

    async def both_running() -> bool:
        return await own_running(b) == 2

    await eventually(both_running)
    for _ in range(3):
        await submit(a, "later")
        await submit(b, "later")
    gates.setdefault("first", asyncio.Event()).set()
    await server.fw.wait(first, timeout=20)

    async def held_back() -> bool:
        """Until an admission pass after the slot's hand-off has counted what each tenant has
        queued (the passes before it counted while the slot changed hands)."""
        for http in (a, b):
            view = (await http.get("/v1/stats")).json()
            held = view["resources"].get("llm", {}).get("held_back_by")
            if held != {"concurrency": view["tasks"]["queued"]}:
                return False
        return True

    await eventually(held_back)
    seen_by_a = (await a.get("/v1/stats")).json()
    seen_by_b = (await b.get("/v1/stats")).json()
    seen_by_ops = (await ops.get("/v1/stats")).json()

    # Only the resource its kinds use, with the fields a tenant may see.
    assert set(seen_by_a["resources"]) == {"llm"}
    llm = seen_by_a["resources"]["llm"]
    assert set(llm) == TENANT_FIELDS
    assert llm["kinds"] == ["llm-call"]
    assert llm["concurrency"] == 2 and llm["limits"]["concurrency"]["value"] == 2
    assert llm["limits"]["concurrency"]["source"] == "configured"
    # Its own use: its tasks in flight, and what held its own candidates back.
    assert llm["in_flight"] == await own_running(a)
    # The tenants' held-back counts add up to the operator's, which are split by tenant.
    everyone = seen_by_ops["resources"]["llm"]["held_back_by_tenant"]
    assert set(everyone) == {"a", "b"}
    for view, http in ((seen_by_a, a), (seen_by_b, b)):
        mine = view["resources"]["llm"]
        assert set(mine) == TENANT_FIELDS
        assert mine["held_back_by"] == everyone[view["tenant"]]
        assert mine["held_back_by"] == {"concurrency": view["tasks"]["queued"]}
        assert mine["in_flight"] == await own_running(http)
    assert llm["in_flight"] + seen_by_b["resources"]["llm"]["in_flight"] == 2
    # Its own caps, with its own use.
    assert seen_by_a["caps"]["concurrency"] == {
        "limit": 5.0,
        "use": float(seen_by_a["tasks"]["running"]),
        "unit": "in flight",
    }
    assert seen_by_ops["caps"] == {}
    assert seen_by_a["upstream"] == {}


async def test_stats_history_holds_each_tenants_own_samples(start_api: StartApi) -> None:
    server = await start_api(keys=KEYS, api={"admin_keys": ADMIN}, run_workers=False)
    a, b, ops = [await server.client(key) for key in ("key-a", "key-b", "key-ops")]
    for n in range(3):
        await a.post("/v1/tasks", json={"kind": "sim", "input": {"n": n}})
    await b.post("/v1/tasks", json={"kind": "sim", "input": {}})
    history = server.app.state.api.history
    assert history is not None

    async def sampled_after_submits() -> bool:
        samples = history.samples()
        return bool(samples) and samples[-1].value[None].tasks["queued"] == 4

    await eventually(sampled_after_submits, timeout=20)
    for http, tenant, queued in ((a, "a", 3), (b, "b", 1), (ops, None, 4)):
        answer = (await http.get("/v1/stats/history")).json()
        assert answer["samples"], tenant
        newest = answer["samples"][-1]["stats"]
        assert newest["tenant"] == tenant
        assert newest["tasks"]["queued"] == queued
        assert all(s["stats"]["tenant"] == tenant for s in answer["samples"])


async def test_workers_are_shown_to_operators_with_the_tasks_they_hold(
    start_api: StartApi, gates: dict[str, asyncio.Event]
) -> None:
    async def slow(ctx: Context, inp: dict[str, Any]) -> dict[str, Any]:
        await gates.setdefault("all", asyncio.Event()).wait()
        return {}

    server = await start_api(keys=KEYS, api={"admin_keys": ADMIN}, handlers={"slow": slow})
    a, ops = await server.client("key-a"), await server.client("key-ops")
    task = (await a.post("/v1/tasks", json={"kind": "slow", "input": {}})).json()

    async def holding() -> bool:
        answer = (await ops.get("/v1/workers")).json()
        return any(t["id"] == task["id"] for w in answer["workers"] for t in w["tasks"])

    await eventually(holding)
    (worker,) = (await ops.get("/v1/workers")).json()["workers"]
    assert worker["pid"] > 0 and worker["host"] and worker["concurrency"] == 8
    assert set(worker["kinds"]) >= {"sim", "slow"} and not worker["silent"]
    assert worker["heartbeat_age_s"] >= 0
    (held,) = worker["tasks"]
    assert (held["id"], held["tenant"], held["kind"], held["attempt"]) == (
        task["id"],
        "a",
        "slow",
        1,
    )
    # Every tenant's tasks are in it: a tenant's key is refused, naming what it needs.
    refused = await a.get("/v1/workers")
    assert refused.status_code == 403
    assert refused.headers["content-type"] == "application/problem+json"
    assert "admin_keys" in refused.json()["detail"]
