"""``/v1/batches``: one transaction in, counts per status out."""

from __future__ import annotations

import asyncio

from floodway.store.base import TaskQuery
from tests.integration.conftest import ApiServer, StartApi


async def test_batch_submits_all_and_reports_progress_until_done(api: ApiServer) -> None:
    http = await api.client()
    tasks = [{"kind": "sim", "input": {"i": i}} for i in range(5)]
    resp = await http.post("/v1/batches", json={"tasks": tasks})
    assert resp.status_code == 202
    batch = resp.json()
    assert batch["id"].startswith("b_") and len(batch["task_ids"]) == 5
    stored = await api.fw.list_tasks(TaskQuery(batch_id=batch["id"]))
    assert sorted(t.id for t in stored) == sorted(batch["task_ids"])

    async with asyncio.timeout(20):
        while True:
            status = (await http.get(f"/v1/batches/{batch['id']}")).json()
            if status["done"]:
                break
            await asyncio.sleep(0.05)
    assert status["total"] == 5 and status["counts"]["succeeded"] == 5
    assert set(status["counts"]) >= {"queued", "running", "succeeded", "failed", "dead"}


async def test_a_bad_item_refuses_the_whole_batch(start_api: StartApi) -> None:
    server = await start_api(run_workers=False)
    http = await server.client()
    tasks = [{"kind": "sim", "input": {}}, {"kind": "nope", "input": {}}]
    resp = await http.post("/v1/batches", json={"tasks": tasks})
    assert resp.status_code == 422
    assert resp.json()["kind"] == "nope"
    assert (await http.get("/v1/tasks")).json()["items"] == []
    assert (await http.post("/v1/batches", json={"tasks": []})).status_code == 422
    missing = await http.get("/v1/batches/b_NOPE")
    assert missing.status_code == 404
    assert missing.json()["type"] == "urn:floodway:problem:batch-not-found"


async def test_batch_idempotency_key_replays_the_same_batch(start_api: StartApi) -> None:
    server = await start_api(run_workers=False)
    http = await server.client()
    body = {"tasks": [{"kind": "sim", "input": {"i": i}} for i in range(3)]}
    first = await http.post("/v1/batches", json=body, headers={"Idempotency-Key": "nightly"})
    again = await http.post("/v1/batches", json=body, headers={"Idempotency-Key": "nightly"})
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["task_ids"] == first.json()["task_ids"] and again.json()["reused"]
    assert len((await http.get("/v1/tasks")).json()["items"]) == 3


async def test_the_batch_list_shows_the_callers_newest_batches_only(start_api: StartApi) -> None:
    server = await start_api(keys={"key-a": "a", "key-b": "b"}, run_workers=False)
    a, b = await server.client("key-a"), await server.client("key-b")
    tasks = [{"kind": "sim", "input": {"n": n}} for n in range(3)]
    first = (await a.post("/v1/batches", json={"tasks": tasks})).json()
    second = (await a.post("/v1/batches", json={"tasks": tasks[:1]})).json()
    theirs = (await b.post("/v1/batches", json={"tasks": tasks})).json()
    await a.delete(f"/v1/tasks/{first['task_ids'][0]}")
    listed = (await a.get("/v1/batches")).json()["items"]
    assert [x["id"] for x in listed] == [second["id"], first["id"]]
    assert listed[1]["total"] == 3 and not listed[1]["done"]
    assert listed[1]["counts"]["cancelled"] == 1 and listed[1]["counts"]["queued"] == 2
    # The same progress the batch's own route answers.
    alone = (await a.get(f"/v1/batches/{first['id']}")).json()
    assert {k: listed[1][k] for k in alone} == alone and listed[1]["created_at"]
    assert [x["id"] for x in (await b.get("/v1/batches")).json()["items"]] == [theirs["id"]]
    assert [x["id"] for x in (await a.get("/v1/batches?limit=1")).json()["items"]] == [second["id"]]
    refused = await a.get("/v1/batches?limit=0")
    assert refused.status_code == 422
    assert refused.headers["content-type"] == "application/problem+json"
