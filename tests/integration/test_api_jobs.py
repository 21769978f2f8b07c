"""``/v1/jobs`` over HTTP: submit, read, follow, cancel, retry; every refusal a problem that
names the step, with nothing written; a job is its tenant's alone."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest

from floodway import Context, FatalError
from tests.integration.conftest import StartApi, eventually
from tests.integration.test_api_webhooks_out import (
    LOCAL_RECEIVERS,
    Receiver,
    serve_receiver,
    verify,
)
from tests.unit.test_jobs_model import INVALID

PROBLEM = "urn:floodway:problem:"


def handlers(calls: Counter[str], fail: set[str]) -> dict[str, Any]:
    async def split(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        calls["split"] += 1
        return {"parts": [f"p{i}" for i in range(value["n"])]}

    async def shout(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        calls["shout"] += 1
        if "shout" in fail:
            raise FatalError("shout refused")
        return {"text": str(value["text"]).upper()}

    async def join(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        calls["join"] += 1
        return {"all": [p["text"] for p in value["parts"]]}

    # the model test's kinds, for its invalid definitions
    async def script(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        return value

    return {"split": split, "shout": shout, "join": join, "script": script}


JOB = {
    "steps": [
        {"name": "split", "kind": "split", "input": {"n": 3}},
        {
            "name": "shout",
            "kind": "shout",
            "input": {"text": "${item}"},
            "after": ["split"],
            "for_each": "${steps.split.result.parts}",
        },
        {"name": "join", "kind": "join", "input": {"parts": "${steps.shout.results}"},
         "after": ["shout"]},
    ]
}  # fmt: skip


async def events_of(http: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    seen = []
    async with http.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line.removeprefix("data: ")))
    return seen


async def test_a_job_runs_over_http_and_its_events_end_with_its_end(start_api: StartApi) -> None:
    calls: Counter[str] = Counter()
    api = await start_api(handlers=handlers(calls, set()))
    http = await api.client()
    resp = await http.post("/v1/jobs", json=JOB)
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["status"] == "running" and [s["name"] for s in job["steps"]] == [
        "split",
        "shout",
        "join",
    ]
    seen = await events_of(http, job["id"])
    assert seen[-1]["status"] == "succeeded"
    assert seen[-1]["result"] == {"join": {"all": ["P0", "P1", "P2"]}}
    got = (await http.get(f"/v1/jobs/{job['id']}")).json()
    assert [len(s["tasks"]) for s in got["steps"]] == [1, 3, 1]
    for step in got["steps"]:
        for task in step["tasks"]:
            one = (await http.get(f"/v1/tasks/{task['id']}")).json()
            assert one["status"] == "succeeded" and one["metadata"]["job_id"] == job["id"]
    assert calls == {"split": 1, "shout": 3, "join": 1}
    listed = (await http.get("/v1/jobs")).json()
    assert [j["id"] for j in listed["items"]] == [job["id"]] and listed["next"] is None


@pytest.mark.parametrize(("steps", "named", "word"), INVALID)
async def test_an_invalid_job_is_a_422_naming_its_step_and_nothing_is_written(
    start_api: StartApi, steps: Any, named: str | None, word: str
) -> None:
    api = await start_api(handlers=handlers(Counter(), set()), run_workers=False)
    api.fw.settings.jobs.max_steps = 10  # the model test's limits
    api.fw.settings.jobs.max_items = 100
    http = await api.client()
    resp = await http.post("/v1/jobs", json={"steps": steps})
    assert resp.status_code == 422, resp.text
    problem = resp.json()
    if steps:  # an empty list is refused by the schema, before the job is read
        assert problem["type"] == PROBLEM + "invalid-job"
        assert problem["step"] == named and word in problem["detail"]
    assert (await http.get("/v1/jobs")).json()["items"] == []
    assert (await http.get("/v1/tasks")).json()["items"] == []


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"steps": "all of them"},
        {"steps": [1, 2]},
        {"steps": [{"name": "a", "kind": "split", "input": {}}], "lane": "fast"},
        {"steps": [{"name": "a", "kind": "split", "input": {}}], "deadline_s": -1},
        {"steps": [{"name": "a", "kind": "split", "input": {}}], "callback_url": "ftp://x"},
        {"steps": [{"name": "a", "kind": "split", "input": {}}], "colour": "red"},
    ],
)
async def test_a_malformed_body_is_a_422_problem(start_api: StartApi, body: Any) -> None:
    api = await start_api(handlers=handlers(Counter(), set()), run_workers=False)
    http = await api.client()
    resp = await http.post("/v1/jobs", json=body)
    assert resp.status_code == 422 and resp.headers["content-type"] == "application/problem+json"
    assert (await http.get("/v1/jobs")).json()["items"] == []


@pytest.mark.parametrize("job_id", ["j_nope", "../../etc", "x" * 300, "%00"])
async def test_a_job_that_cannot_exist_is_not_found(start_api: StartApi, job_id: str) -> None:
    http = await (await start_api(run_workers=False)).client()
    for method, path in (
        ("GET", ""),
        ("DELETE", ""),
        ("POST", "/retry"),
        ("GET", "/events"),
    ):
        resp = await http.request(method, f"/v1/jobs/{job_id}{path}")
        assert resp.status_code == 404, (method, path, resp.text)


async def test_a_job_is_its_tenants_alone(start_api: StartApi) -> None:
    api = await start_api(
        keys={"k-acme": "acme", "k-globex": "globex"},
        handlers=handlers(Counter(), set()),
        run_workers=False,
    )
    acme, globex = await api.client("k-acme"), await api.client("k-globex")
    job = (await acme.post("/v1/jobs", json=JOB)).json()
    for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/retry"), ("GET", "/events")):
        resp = await globex.request(method, f"/v1/jobs/{job['id']}{path}")
        assert resp.status_code == 404 and resp.json()["type"] == PROBLEM + "job-not-found"
    assert (await globex.get("/v1/jobs")).json()["items"] == []
    task_id = job["steps"][0]["tasks"][0]["id"]
    assert (await globex.get(f"/v1/tasks/{task_id}")).status_code == 404
    assert (await acme.get(f"/v1/jobs/{job['id']}")).status_code == 200


async def test_cancel_and_retry_answer_409_where_they_do_not_apply(start_api: StartApi) -> None:
    calls: Counter[str] = Counter()
    fail = {"shout"}
    api = await start_api(handlers=handlers(calls, fail))
    http = await api.client()
    job = (await http.post("/v1/jobs", json=JOB)).json()
    failed = (await events_of(http, job["id"]))[-1]
    assert failed["status"] == "failed" and failed["error"]["step"] == "shout"
    assert (await http.delete(f"/v1/jobs/{job['id']}")).status_code == 409
    fail.clear()
    retried = await http.post(f"/v1/jobs/{job['id']}/retry")
    assert retried.status_code == 200, retried.text
    done = (await events_of(http, job["id"]))[-1]
    assert done["status"] == "succeeded"
    assert calls["split"] == 1 and calls["join"] == 1
    assert (await http.post(f"/v1/jobs/{job['id']}/retry")).status_code == 409
    other = (await http.post("/v1/jobs", json=JOB)).json()
    cancelled = await http.delete(f"/v1/jobs/{other['id']}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert (await http.delete(f"/v1/jobs/{other['id']}")).status_code == 409


async def test_the_openapi_document_declares_the_jobs_routes(start_api: StartApi) -> None:
    http = await (await start_api(run_workers=False)).client()
    paths = (await http.get("/openapi.json")).json()["paths"]
    assert set(paths["/v1/jobs"]) == {"get", "post"}
    assert set(paths["/v1/jobs/{job_id}"]) == {"get", "delete"}
    assert "post" in paths["/v1/jobs/{job_id}/retry"]
    assert "get" in paths["/v1/jobs/{job_id}/events"]


async def test_a_jobs_callback_is_called_once_at_its_end(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    receiver = Receiver(failures=1)
    url = await serve_receiver(api_stack, receiver)
    api = await start_api(
        keys={"k-acme": "acme"}, handlers=handlers(Counter(), set()), api=LOCAL_RECEIVERS
    )
    http = await api.client("k-acme")
    body = {**JOB, "callback_url": url}
    job = (await http.post("/v1/jobs", json=body)).json()
    async with asyncio.timeout(20):
        await receiver.got_one.wait()

    async def delivered() -> bool:
        found = await api.fw.runtime.jobs.get_job(job["id"], "acme")
        return found is not None and found[0].callback_state == "delivered"

    await eventually(delivered)  # nothing is delivered after this
    assert len(receiver.calls) == 2  # one refused, then delivered: one message
    assert len({headers["webhook-id"] for headers, _ in receiver.calls}) == 1
    headers, raw = receiver.calls[-1]
    assert verify("k-acme", headers, raw)
    payload = json.loads(raw)
    assert payload["type"] == "job.succeeded" and payload["data"]["id"] == job["id"]
    assert payload["data"]["result"] == {"join": {"all": ["P0", "P1", "P2"]}}
    tasks = (await http.get("/v1/tasks")).json()["items"]
    assert all(t.get("callback_url") is None for t in tasks)  # the steps call nobody
