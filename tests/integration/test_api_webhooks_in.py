"""``POST /v1/webhooks/{kind}``: signed provider callbacks complete tasks waiting on upstream
jobs, once, however often they arrive."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from typing import Any

import httpx

from floodway import Floodway
from floodway.config import KindConfig
from floodway.context import Context
from floodway.core.states import Status
from floodway.core.task import Task
from floodway.store.base import ClaimParams
from tests.integration.conftest import ApiServer, StartApi

SECRET = "whsec-test-secret"


async def never_called(ctx: Context, value: Any) -> Any:
    raise AssertionError("no worker runs in these tests")


async def start(start_api: StartApi) -> ApiServer:
    return await start_api(
        run_workers=False,
        kinds={
            "upstream": KindConfig(adapter="python", webhook_secret=SECRET),
            "nosecret": KindConfig(adapter="python"),
        },
        handlers={"upstream": never_called, "nosecret": never_called},
    )


async def waiting_task(fw: Floodway, ref: str, *, parked: bool = True) -> Task:
    """A task whose handler submitted upstream job ``ref``: parked (no worker holds it) or
    still leased by a worker."""
    task = await fw.submit("upstream", {"job": ref})
    now = fw.clock.now()
    token = f"tok-{ref}"
    params = ClaimParams("w-test", token, ("upstream",), 1, now, 30, ids=(task.id,))
    assert len(await fw.store.claim(params)) == 1
    if parked:
        assert await fw.store.park(task.id, token, ref, now + 3600, now)
    else:
        assert await fw.store.set_upstream_ref(task.id, token, ref, now)
    return await fw.get(task.id)


def signed(
    payload: dict[str, Any], *, secret: str = SECRET, msg_id: str = "msg_1", at: int | None = None
) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    ts = str(int(time.time()) if at is None else at)
    mac = hmac.new(secret.encode(), f"{msg_id}.{ts}.".encode() + body, hashlib.sha256)
    return body, {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": ts,
        "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode(),
    }


async def events_of(fw: Floodway, task_id: str) -> list[Status]:
    return [e.status for e in await fw.store.events(task_id)]


async def test_a_valid_callback_applies_once_when_delivered_three_times(
    start_api: StartApi,
) -> None:
    server = await start(start_api)
    http = await server.client()
    task = await waiting_task(server.fw, "job-1")
    body, headers = signed(
        {"id": "job-1", "status": "succeeded", "result": {"url": "u"}, "usage": 7}
    )

    answers = await asyncio.gather(
        *(http.post("/v1/webhooks/upstream", content=body, headers=headers) for _ in range(3))
    )
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert sorted(r.json()["status"] for r in answers) == ["applied", "ignored", "ignored"]
    late = await http.post("/v1/webhooks/upstream", content=body, headers=headers)
    assert late.json() == {"status": "ignored", "task_id": task.id, "task_status": "succeeded"}

    done = await server.fw.get(task.id)
    assert done.status is Status.SUCCEEDED and done.result == {"url": "u"}
    assert (await events_of(server.fw, task.id)).count(Status.SUCCEEDED) == 1


async def test_forged_or_replayed_callbacks_change_nothing(start_api: StartApi) -> None:
    server = await start(start_api)
    http = await server.client()
    task = await waiting_task(server.fw, "job-2")
    payload = {"id": "job-2", "status": "succeeded", "result": {"forged": True}}

    forged_body, forged = signed(payload, secret="not-the-secret")
    stale_body, stale = signed(payload, at=int(time.time()) - 6 * 60)
    future_body, future = signed(payload, at=int(time.time()) + 6 * 60)
    good_body, good = signed({**payload, "result": {"real": True}})
    tampered = good_body.replace(b"real", b"fake")
    attempts = [
        (forged_body, forged),
        (stale_body, stale),
        (future_body, future),
        (tampered, good),
        (good_body, {"content-type": "application/json"}),  # unsigned
        (good_body, {**good, "webhook-timestamp": "yesterday"}),
    ]
    for body, headers in attempts:
        resp = await http.post("/v1/webhooks/upstream", content=body, headers=headers)
        assert resp.status_code == 401, resp.text
        assert resp.json()["type"] == "urn:floodway:problem:invalid-signature"
    still = await server.fw.get(task.id)
    assert still.status is Status.RUNNING and still.parked and still.result is None
    assert await events_of(server.fw, task.id) == [Status.QUEUED, Status.RUNNING]

    # Key rotation: one matching signature among several is enough.
    headers = {**good, "webhook-signature": "v1,AAAA " + good["webhook-signature"]}
    ok = await http.post("/v1/webhooks/upstream", content=good_body, headers=headers)
    assert ok.json()["status"] == "applied"
    assert (await server.fw.get(task.id)).result == {"real": True}


async def test_failed_jobs_late_parks_and_unknown_targets(start_api: StartApi) -> None:
    server = await start(start_api)
    fw = server.fw
    http = await server.client()
    parked = await waiting_task(fw, "job-3")

    # A failed job is retried (as a failed poll would be): the task is not lost to it.
    body, headers = signed({"id": "job-3", "status": "failed", "error": "upstream overloaded"})
    resp = await http.post("/v1/webhooks/upstream", content=body, headers=headers)
    assert resp.json() == {"status": "applied", "task_id": parked.id, "task_status": "retrying"}
    retrying = await fw.get(parked.id)
    assert retrying.error is not None and retrying.error.type == "upstream_failed"
    assert retrying.error.message == "upstream overloaded"

    # The callback outruns the worker's park of its task: it waits for the park, then lands.
    leased = await waiting_task(fw, "job-4", parked=False)
    body, headers = signed({"id": "job-4", "status": "done", "result": 1})
    callback = asyncio.create_task(
        http.post("/v1/webhooks/upstream", content=body, headers=headers)
    )
    await asyncio.sleep(0.05)
    assert await fw.store.park(
        leased.id, "tok-job-4", "job-4", fw.clock.now() + 3600, fw.clock.now()
    )
    assert (await callback).json()["status"] == "applied"
    assert (await fw.get(leased.id)).status is Status.SUCCEEDED

    # A progress note is not an end state.
    note, headers = signed({"id": "job-4", "status": "running"})
    resp = await http.post("/v1/webhooks/upstream", content=note, headers=headers)
    assert resp.status_code == 200 and resp.json()["status"] == "ignored"

    body, headers = signed({"id": "job-unknown", "status": "succeeded"})
    unknown_job = await http.post("/v1/webhooks/upstream", content=body, headers=headers)
    assert unknown_job.status_code == 404
    assert unknown_job.json()["type"] == "urn:floodway:problem:unknown-upstream-job"
    for kind in ("nope", "nosecret", "sim"):
        resp = await http.post(f"/v1/webhooks/{kind}", content=body, headers=headers)
        assert resp.status_code == 404 and resp.json()["type"].endswith("unknown-webhook")

    no_id, headers = signed({"status": "succeeded"})
    assert (
        await http.post("/v1/webhooks/upstream", content=no_id, headers=headers)
    ).status_code == 422
    not_json = b"not json"
    ts = str(int(time.time()))
    mac = hmac.new(SECRET.encode(), f"m.{ts}.".encode() + not_json, hashlib.sha256)
    sig = "v1," + base64.b64encode(mac.digest()).decode()
    raw_headers = {"webhook-id": "m", "webhook-timestamp": ts, "webhook-signature": sig}
    async with httpx.AsyncClient(base_url=server.url) as raw:
        resp = await raw.post("/v1/webhooks/upstream", content=not_json, headers=raw_headers)
    assert resp.status_code == 400
