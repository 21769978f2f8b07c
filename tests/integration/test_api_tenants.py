"""API keys and tenants: every read and write is the caller's tenant's; another tenant's task
is a 404, never a 403."""

from __future__ import annotations

import httpx
import pytest

from floodway import Floodway
from floodway.api import check_bind, run
from floodway.config import ApiConfig, Settings
from floodway.core.errors import ConfigError
from tests.integration.conftest import StartApi

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}


async def test_every_task_endpoint_hides_other_tenants_tasks(start_api: StartApi) -> None:
    server = await start_api(keys=KEYS, run_workers=False)
    a, b = await server.client("key-a"), await server.client("key-b")
    task = (await a.post("/v1/tasks", json={"kind": "sim", "input": {"x": 1}})).json()
    assert task["tenant"] == "tenant-a"
    batch = (await a.post("/v1/batches", json={"tasks": [{"kind": "sim", "input": {}}]})).json()
    tid = task["id"]

    refused = [
        await b.get(f"/v1/tasks/{tid}"),
        await b.delete(f"/v1/tasks/{tid}"),
        await b.post(f"/v1/tasks/{tid}/retry"),
        await b.get(f"/v1/tasks/{tid}/events"),
        await b.get(f"/v1/batches/{batch['id']}"),
    ]
    for resp in refused:
        assert resp.status_code == 404, resp.request.url
        assert resp.headers["content-type"] == "application/problem+json"
    assert (await b.get("/v1/tasks")).json() == {"items": [], "next": None}

    # Tenant A still sees (and owns) its task, untouched by B's attempts.
    mine = await a.get(f"/v1/tasks/{tid}")
    assert mine.status_code == 200 and mine.json()["status"] == "queued"
    assert [t["id"] for t in (await a.get("/v1/tasks")).json()["items"]] == [
        tid,
        *batch["task_ids"],
    ]
    # The same Idempotency-Key in two tenants names two different tasks.
    body = {"kind": "sim", "input": {"k": 1}}
    ta = await a.post("/v1/tasks", json=body, headers={"Idempotency-Key": "shared"})
    tb = await b.post("/v1/tasks", json=body, headers={"Idempotency-Key": "shared"})
    assert ta.status_code == tb.status_code == 202 and ta.json()["id"] != tb.json()["id"]


async def test_missing_or_wrong_key_is_401_and_both_headers_work(start_api: StartApi) -> None:
    server = await start_api(keys=KEYS, run_workers=False)
    async with httpx.AsyncClient(base_url=server.url) as anon:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"X-API-Key": "nope"}):
            resp = await anon.get("/v1/tasks", headers=headers)
            assert resp.status_code == 401
            assert resp.headers["content-type"] == "application/problem+json"
            assert resp.headers["www-authenticate"] == "Bearer"
        assert (await anon.get("/v1/tasks", headers={"X-API-Key": "key-b"})).status_code == 200
        assert (await anon.get("/v1/stats", headers={"X-API-Key": "key-a"})).status_code == 200
        submit = await anon.post("/v1/tasks", json={"kind": "sim", "input": {}})
        assert submit.status_code == 401
        # Health stays open for probes; metrics tell about every tenant: operators only
        # (or a private listener, [api] metrics_port).
        assert (await anon.get("/healthz")).status_code == 200
        assert (await anon.get("/metrics")).status_code == 401


async def test_open_api_is_tenant_default(start_api: StartApi) -> None:
    server = await start_api(run_workers=False)
    http = await server.client("any-key-is-ignored")
    task = (await http.post("/v1/tasks", json={"kind": "sim", "input": {}})).json()
    assert task["tenant"] == "default"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_check_bind_allows_loopback_without_keys(host: str) -> None:
    check_bind(host, Settings())


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_check_bind_refuses_an_open_api_elsewhere(host: str) -> None:
    with pytest.raises(ConfigError, match=f"refusing to bind {host} with no API keys"):
        check_bind(host, Settings())
    check_bind(host, Settings(api=ApiConfig(keys={"k": "t"})))  # with keys: fine
    with pytest.raises(ConfigError):  # and the CLI's entry point checks before serving
        run(Floodway(settings=Settings()), host=host, port=0)
