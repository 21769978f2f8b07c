"""Admission refusals at the API: 429 with Retry-After, naming the limit."""

from __future__ import annotations

import httpx

from tests.integration.conftest import StartApi


def assert_refused(resp: httpx.Response, limit: str) -> None:
    assert resp.status_code == 429, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert int(resp.headers["retry-after"]) >= 1
    problem = resp.json()
    assert problem["type"] == "urn:floodway:problem:admission-refused"
    assert problem["limit"] == limit
    assert problem["retry_after"] > 0


async def test_submit_rate_refuses_with_retry_after(start_api: StartApi) -> None:
    server = await start_api(
        keys={"ka": "a", "kb": "b"}, tenants={"submit_rate": "2/m"}, run_workers=False
    )
    a, b = await server.client("ka"), await server.client("kb")
    body = {"kind": "sim", "input": {}}
    assert (await a.post("/v1/tasks", json=body)).status_code == 202
    assert (await a.post("/v1/batches", json={"tasks": [body, body]})).status_code == 202
    assert_refused(await a.post("/v1/tasks", json=body), "submit_rate")
    assert_refused(await a.post("/v1/batches", json={"tasks": [body]}), "submit_rate")
    # Another tenant has its own bucket; reads are never rate limited.
    assert (await b.post("/v1/tasks", json=body)).status_code == 202
    assert (await a.get("/v1/tasks")).status_code == 200
    assert len((await a.get("/v1/tasks")).json()["items"]) == 3


async def test_submits_answer_503_naming_the_limiter_while_its_redis_is_down(
    start_api: StartApi,
) -> None:
    """The submit rate cannot be checked: refuse (fail closed), say why, store nothing."""
    server = await start_api(
        tenants={"submit_rate": "100/s"}, redis="redis://127.0.0.1:1/0", run_workers=False
    )
    http = await server.client()
    resp = await http.post("/v1/tasks", json={"kind": "sim", "input": {}})
    assert resp.status_code == 503, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.headers["retry-after"] == "1"
    problem = resp.json()
    assert problem["type"] == "urn:floodway:problem:limiter-unavailable"
    assert "Redis" in problem["detail"]
    assert (await http.get("/v1/tasks")).json()["items"] == []


async def test_interactive_depth_refuses_with_retry_after(start_api: StartApi) -> None:
    server = await start_api(tenants={"interactive_depth": 2}, run_workers=False)
    http = await server.client()
    interactive = {"kind": "sim", "input": {}, "lane": "interactive"}
    first = await http.post("/v1/tasks", json={**interactive, "input": {"n": 1}})
    await http.post("/v1/tasks", json={**interactive, "input": {"n": 2}})
    assert_refused(
        await http.post("/v1/tasks", json={**interactive, "input": {"n": 3}}), "interactive_depth"
    )
    # Background work is not limited by it, and a finished interactive task frees a place.
    assert (
        await http.post("/v1/tasks", json={"kind": "sim", "input": {"bg": 1}})
    ).status_code == 202
    await http.delete(f"/v1/tasks/{first.json()['id']}")
    again = await http.post("/v1/tasks", json={**interactive, "input": {"n": 3}})
    assert again.status_code == 202
