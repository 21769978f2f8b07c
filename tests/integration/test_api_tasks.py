"""``/v1/tasks`` through a real uvicorn server: submit, get, list, cancel, retry, events."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

import httpx

from floodway.core.states import Status
from tests.integration.conftest import ApiServer, StartApi

TASK_FIELDS = {
    "id",
    "kind",
    "status",
    "lane",
    "tenant",
    "input",
    "result",
    "error",
    "tier",
    "attempts",
    "max_attempts",
    "idempotency_key",
    "duplicate_of",
    "upstream_ref",
    "upstream_request_id",
    "cost",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "deadline_at",
    "next_attempt_at",
    "metadata",
}
TERMINAL = {"succeeded", "failed", "dead", "timeout", "cancelled", "deduped"}


async def wait_terminal(http: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    """Follow the task's event stream to its end, then read it."""
    async with asyncio.timeout(20), http.stream("GET", f"/v1/tasks/{task_id}/events") as resp:
        assert resp.status_code == 200
        async for _ in resp.aiter_lines():
            pass
    task: dict[str, Any] = (await http.get(f"/v1/tasks/{task_id}")).json()
    assert task["status"] in TERMINAL
    return task


async def read_events(resp: httpx.Response) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async for line in resp.aiter_lines():
        if not line:
            if current:
                events.append(current)
            current = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            current[name] = value
    return events


def iso(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    offset = parsed.utcoffset()
    assert offset is not None and offset.total_seconds() == 0
    return parsed


async def test_submit_answers_202_with_the_task_json(api: ApiServer) -> None:
    http = await api.client()
    body = {
        "kind": "sim",
        "input": {"prompt": "a cat"},
        "lane": "interactive",
        "metadata": {"m": 1},
    }
    resp = await http.post("/v1/tasks", json=body)
    assert resp.status_code == 202
    task = resp.json()
    assert set(task) == TASK_FIELDS | {"reused"}
    assert task["reused"] is False
    assert task["kind"] == "sim" and task["lane"] == "interactive" and task["tenant"] == "default"
    assert task["input"] == {"prompt": "a cat"} and task["metadata"] == {"m": 1}
    assert task["cost"] == {"estimated": 0.0, "actual": None, "held": 0.0, "over_estimate": 0.0}
    iso(task["created_at"]), iso(task["updated_at"]), iso(task["deadline_at"])

    done = await wait_terminal(http, task["id"])
    assert done["status"] == "succeeded"
    assert done["result"]["echo"] == {"prompt": "a cat"}
    assert done["attempts"] == 1 and done["error"] is None
    assert iso(done["finished_at"]) >= iso(done["started_at"]) >= iso(done["created_at"])
    assert done["next_attempt_at"] is None  # only meaningful while waiting


async def test_get_a_task_and_404_for_an_unknown_one(api: ApiServer) -> None:
    http = await api.client()
    created = (await http.post("/v1/tasks", json={"kind": "sim", "input": {"n": 1}})).json()
    got = await http.get(f"/v1/tasks/{created['id']}")
    assert got.status_code == 200 and got.json()["id"] == created["id"]
    for missing in ("t_NOPE", "has%20space", "x" * 300):
        resp = await http.get(f"/v1/tasks/{missing}")
        assert resp.status_code == 404
        assert resp.headers["content-type"] == "application/problem+json"
        assert resp.json()["type"] == "urn:floodway:problem:task-not-found"


async def test_same_idempotency_key_returns_the_same_task(api: ApiServer) -> None:
    http = await api.client()
    body = {"kind": "sim", "input": {"doc": 42}}
    first = await http.post("/v1/tasks", json=body, headers={"Idempotency-Key": "doc-42"})
    again = await http.post("/v1/tasks", json=body, headers={"Idempotency-Key": "doc-42"})
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["reused"] is True
    assert again.json()["idempotency_key"] == "doc-42"

    other = {"kind": "sim", "input": {"doc": 43}}
    conflict = await http.post("/v1/tasks", json=other, headers={"Idempotency-Key": "doc-42"})
    assert conflict.status_code == 409
    problem = conflict.json()
    assert problem["type"] == "urn:floodway:problem:idempotency-conflict"
    assert problem["task_id"] == first.json()["id"] and problem["key"] == "doc-42"


async def test_twenty_concurrent_posts_with_one_key_make_one_task(start_api: StartApi) -> None:
    server = await start_api(run_workers=False)
    http = await server.client()
    body = {"kind": "sim", "input": {"same": True}}
    answers = await asyncio.gather(
        *(http.post("/v1/tasks", json=body, headers={"Idempotency-Key": "once"}) for _ in range(20))
    )
    assert sorted(r.status_code for r in answers) == [200] * 19 + [202]
    assert len({r.json()["id"] for r in answers}) == 1
    listed = (await http.get("/v1/tasks", params={"limit": 100})).json()
    assert len(listed["items"]) == 1


async def test_list_filters_and_pages_with_an_opaque_cursor(start_api: StartApi) -> None:
    server = await start_api(run_workers=False)
    http = await server.client()
    ids = []
    for i in range(5):
        lane = "interactive" if i == 0 else "background"
        resp = await http.post("/v1/tasks", json={"kind": "sim", "input": {"i": i}, "lane": lane})
        ids.append(resp.json()["id"])

    seen, after, pages = [], None, 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if after:
            params["after"] = after
        page = (await http.get("/v1/tasks", params=params)).json()
        seen += [t["id"] for t in page["items"]]
        pages += 1
        after = page["next"]
        if after is None:
            break
        assert not after.isdigit()  # opaque, not a bare sequence number
    assert seen == ids and pages == 3

    interactive = (await http.get("/v1/tasks", params={"lane": "interactive"})).json()
    assert [t["id"] for t in interactive["items"]] == ids[:1] and interactive["next"] is None
    queued = (await http.get("/v1/tasks", params={"status": "queued", "kind": "sim"})).json()
    assert len(queued["items"]) == 5
    none = (await http.get("/v1/tasks", params={"status": "succeeded"})).json()
    assert none == {"items": [], "next": None}

    for bad, status in (
        ({"after": "not-a-cursor"}, 400),
        ({"status": "sleeping"}, 422),
        ({"limit": 0}, 422),
    ):
        resp = await http.get("/v1/tasks", params=bad)
        assert resp.status_code == status, bad
        assert resp.headers["content-type"] == "application/problem+json"


async def test_cancel_a_queued_task_then_cancel_again_is_409(start_api: StartApi) -> None:
    server = await start_api(run_workers=False)
    http = await server.client()
    task = (await http.post("/v1/tasks", json={"kind": "sim", "input": {}})).json()
    resp = await http.delete(f"/v1/tasks/{task['id']}")
    assert resp.status_code == 200
    assert resp.json()["status"] == "cancelled"
    assert resp.json()["error"]["class"] == "cancelled"
    again = await http.delete(f"/v1/tasks/{task['id']}")
    assert again.status_code == 409
    assert again.json()["type"] == "urn:floodway:problem:illegal-transition"
    assert (await http.delete("/v1/tasks/t_NOPE")).status_code == 404


async def test_retry_a_failed_task_and_409_for_a_succeeded_one(api: ApiServer) -> None:
    http = await api.client()
    refused = (
        await http.post("/v1/tasks", json={"kind": "sim", "input": {"fail": "refusal"}})
    ).json()
    failed = await wait_terminal(http, refused["id"])
    assert failed["status"] == "failed"
    assert failed["error"] == {
        "class": "fatal",
        "type": "content_policy",
        "message": "simulated content policy refusal",
    }
    retried = await http.post(f"/v1/tasks/{refused['id']}/retry")
    assert retried.status_code == 200
    assert retried.json()["status"] in {"queued", "running", "failed"}
    assert retried.json()["attempts"] in (0, 1)

    ok = (await http.post("/v1/tasks", json={"kind": "sim", "input": {"fine": 1}})).json()
    await wait_terminal(http, ok["id"])
    conflict = await http.post(f"/v1/tasks/{ok['id']}/retry")
    assert conflict.status_code == 409
    assert (await http.post("/v1/tasks/t_NOPE/retry")).status_code == 404


async def test_events_stream_one_event_per_change_and_ends_at_terminal(api: ApiServer) -> None:
    http = await api.client()
    task = (await http.post("/v1/tasks", json={"kind": "sim", "input": {"e": 1}})).json()
    url = f"/v1/tasks/{task['id']}/events"
    async with asyncio.timeout(20), http.stream("GET", url) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = await read_events(resp)
    statuses = [json.loads(e["data"])["status"] for e in events]
    assert statuses == ["queued", "running", "succeeded"]
    assert all(e["event"] == "status" for e in events)
    # Each event's id is its place among the task's own events, not the ledger's global
    # order (which would count what other tenants did meanwhile).
    seqs = [int(e["id"]) for e in events]
    assert seqs == [1, 2, 3]

    # Resuming after the second event replays only what came after it.
    headers = {"Last-Event-ID": str(seqs[1])}
    async with asyncio.timeout(20), http.stream("GET", url, headers=headers) as resp:
        rest = await read_events(resp)
    assert [json.loads(e["data"])["status"] for e in rest] == ["succeeded"]

    assert (await http.get("/v1/tasks/t_NOPE/events")).status_code == 404


async def test_the_last_event_carries_the_task_as_get_answers_it(api: ApiServer) -> None:
    http = await api.client()
    for body, ended in (({"e": 2}, "succeeded"), ({"fail": "refusal"}, "failed")):
        task = (await http.post("/v1/tasks", json={"kind": "sim", "input": body})).json()
        url = f"/v1/tasks/{task['id']}/events"
        async with asyncio.timeout(20), http.stream("GET", url) as resp:
            events = await read_events(resp)
        datas = [json.loads(e["data"]) for e in events]
        got = (await http.get(f"/v1/tasks/{task['id']}")).json()
        assert datas[-1]["status"] == ended
        assert datas[-1]["task"] == got  # the result (or error): no second request needed
        assert (got["result"] if ended == "succeeded" else got["error"]) is not None
        assert all("task" not in d for d in datas[:-1])
        # Resumed before the end: the last event again holds the task; at the end: nothing.
        for after, expected in ((events[0]["id"], [ended]), (events[-1]["id"], [])):
            resume = {"Last-Event-ID": after}
            async with asyncio.timeout(20), http.stream("GET", url, headers=resume) as resp:
                rest = [json.loads(e["data"]) for e in await read_events(resp)]
            assert [d["status"] for d in rest if "task" in d] == expected
            if expected:
                assert rest[-1]["task"] == got


async def test_a_retried_task_streams_on_past_its_first_end(api: ApiServer) -> None:
    """A terminal event the task has left (a manual retry queued it again) neither ends the
    stream nor carries the task: only the event of the end it stays at does."""
    http = await api.client()
    task = (await http.post("/v1/tasks", json={"kind": "sim", "input": {"fail": "refusal"}})).json()
    first = await wait_terminal(http, task["id"])
    assert first["status"] == "failed"
    assert (await http.post(f"/v1/tasks/{task['id']}/retry")).status_code == 200
    second = await wait_terminal(http, task["id"])
    async with asyncio.timeout(20), http.stream("GET", f"/v1/tasks/{task['id']}/events") as resp:
        datas = [json.loads(e["data"]) for e in await read_events(resp)]
    statuses = [d["status"] for d in datas]
    assert statuses.count("failed") == 2 and statuses[-1] == "failed"
    assert [d["status"] for d in datas if "task" in d] == ["failed"]
    assert datas[-1]["task"] == second
    assert datas[-1]["task"]["attempts"] == second["attempts"]


async def test_events_are_woken_by_the_change_not_by_a_timer(start_api: StartApi) -> None:
    # The slow re-check is far longer than the test's guard: only the change hub can end it.
    server = await start_api(run_workers=False, sse_recheck_s=3600)
    http = await server.client()
    task = (await http.post("/v1/tasks", json={"kind": "sim", "input": {}})).json()
    url = f"/v1/tasks/{task['id']}/events"
    async with asyncio.timeout(20), http.stream("GET", url) as resp:
        lines = resp.aiter_lines()
        while (await anext(lines)) != "":
            pass  # the first event (queued) is there
        await server.fw.cancel(task["id"])
        rest = [line async for line in lines]
    assert any('"status":"cancelled"' in line for line in rest)
    assert (await server.fw.get(task["id"])).status is Status.CANCELLED


async def test_a_cursor_is_good_only_for_the_tenant_it_was_given_to(start_api: StartApi) -> None:
    """A cursor is sealed (the global sequence would tell a tenant how many tasks all tenants
    made between two of its pages) and tied to its tenant: another tenant's is a 400."""
    server = await start_api(keys={"key-a": "a", "key-b": "b"}, run_workers=False)
    a, b = await server.client("key-a"), await server.client("key-b")
    for n in range(3):
        await a.post("/v1/tasks", json={"kind": "sim", "input": {"n": n}})
    first = (await a.get("/v1/tasks", params={"limit": 1})).json()["next"]
    for n in range(20):
        await b.post("/v1/tasks", json={"kind": "sim", "input": {"n": n}})
    second = (await a.get("/v1/tasks", params={"limit": 1, "after": first})).json()["next"]
    assert first != second and len(first) == len(second)

    foreign = await b.get("/v1/tasks", params={"after": first})
    assert foreign.status_code == 400
    assert foreign.headers["content-type"] == "application/problem+json"
    problem = foreign.json()
    assert problem["type"].endswith(":invalid-cursor") and "per tenant" in problem["detail"]
    forged = first[:-2] + ("AA" if first[-2:] != "AA" else "BB")
    assert (await a.get("/v1/tasks", params={"after": forged})).status_code == 400
    assert (await a.get("/v1/tasks", params={"after": "c1-5"})).status_code == 400
