"""Outbound webhooks: a task's ``callback_url`` gets a signed POST when the task ends, retried
with full-jitter backoff while the receiver fails."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response

from floodway.api import serving
from tests.integration.conftest import ApiServer, StartApi, eventually


@dataclass
class Receiver:
    """Answers 500 to the first ``failures`` deliveries, then 204; records all of them."""

    failures: int = 0
    calls: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    got_one: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/hook")
        async def hook(request: Request) -> Response:
            self.calls.append((dict(request.headers), await request.body()))
            if len(self.calls) <= self.failures:
                return Response(status_code=500)
            self.got_one.set()
            return Response(status_code=204)

        return app


#: the receivers of these tests listen on loopback, which only a listed host may be
LOCAL_RECEIVERS = {"callback_hosts": ["127.0.0.1"]}


async def serve_receiver(stack: AsyncExitStack, receiver: Receiver) -> str:
    return await stack.enter_async_context(serving(receiver.app())) + "/hook"


async def callback_state_is(server: ApiServer, task_id: str, state: str) -> bool:
    return (await server.fw.get(task_id)).callback_state == state


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    mac = base64.b64encode(hmac.new(secret.encode(), signed, hashlib.sha256).digest()).decode()
    return headers["webhook-signature"] == "v1," + mac


async def test_callback_is_signed_and_retried_until_delivered(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    receiver = Receiver(failures=2)
    url = await serve_receiver(api_stack, receiver)
    server = await start_api(keys={"key-a": "tenant-a"}, api=LOCAL_RECEIVERS)
    http = await server.client("key-a")
    task = (
        await http.post("/v1/tasks", json={"kind": "sim", "input": {"x": 1}, "callback_url": url})
    ).json()

    async with asyncio.timeout(20):
        await receiver.got_one.wait()
    assert len(receiver.calls) == 3  # two failures, then delivered
    ids = {headers["webhook-id"] for headers, _ in receiver.calls}
    assert len(ids) == 1  # the same message each time: receivers can drop duplicates
    for headers, body in receiver.calls:
        assert verify("key-a", headers, body)  # the tenant's API key signs its webhooks
        assert not verify("floodway", headers, body)
    payload: dict[str, Any] = json.loads(receiver.calls[-1][1])
    assert payload["type"] == "task.succeeded"
    assert payload["data"]["id"] == task["id"] and payload["data"]["status"] == "succeeded"
    assert payload["data"]["result"]["echo"] == {"x": 1}

    await eventually(lambda: callback_state_is(server, task["id"], "delivered"))
    stored = await server.fw.get(task["id"])
    assert stored.callback_attempts == 3


async def test_a_receiver_that_never_answers_is_given_up(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    receiver = Receiver(failures=10**6)
    url = await serve_receiver(api_stack, receiver)
    server = await start_api(api=LOCAL_RECEIVERS)
    http = await server.client()
    task = (
        await http.post("/v1/tasks", json={"kind": "sim", "input": {}, "callback_url": url})
    ).json()
    await eventually(lambda: callback_state_is(server, task["id"], "failed"))
    assert len(receiver.calls) == 8  # max_attempts, then no more
    headers, body = receiver.calls[0]
    assert verify("floodway", headers, body)  # the open API's documented secret

    # An unreachable URL is a failed delivery like any other, never an error in the loop.
    dead = (
        await http.post(
            "/v1/tasks",
            json={"kind": "sim", "input": {"d": 1}, "callback_url": "http://127.0.0.1:9/x"},
        )
    ).json()
    await eventually(lambda: callback_state_is(server, dead["id"], "failed"))


async def test_callback_hosts_keeps_the_outbox_off_hosts_nobody_named(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    receiver = Receiver()
    url = await serve_receiver(api_stack, receiver)  # http://127.0.0.1:<port>/hook
    server = await start_api(api={"callback_hosts": ["127.0.0.1", "*.hooks.example"]})
    http = await server.client()
    inside = "http://169.254.169.254/latest/meta-data"  # a cloud metadata endpoint, say
    for body in (
        {"kind": "sim", "input": {}, "callback_url": inside},
        {"tasks": [{"kind": "sim", "input": {"n": 1}, "callback_url": inside}]},
    ):
        path = "/v1/tasks" if "kind" in body else "/v1/batches"
        resp = await http.post(path, json=body)
        assert resp.status_code == 422, resp.text  # as any other invalid input
        assert resp.headers["content-type"] == "application/problem+json"
        assert "'169.254.169.254' is not allowed" in resp.json()["detail"]
        assert "api.callback_hosts" in resp.json()["detail"]
    assert (await http.get("/v1/tasks")).json()["items"] == []  # nothing was stored
    ok = await http.post("/v1/tasks", json={"kind": "sim", "input": {"n": 2}, "callback_url": url})
    assert ok.status_code == 202
    also = {"kind": "sim", "input": {"n": 3}, "callback_url": "https://A.Hooks.Example/x"}
    assert (await http.post("/v1/tasks", json=also)).status_code == 202
    await asyncio.wait_for(receiver.got_one.wait(), 20)


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("http://127.0.0.1:8080/admin", "loopback"),
        ("http://[::1]/x", "loopback"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://10.1.2.3/x", "private"),
        ("http://192.168.0.10/x", "private"),
        ("http://100.64.0.1/x", "carrier-grade NAT"),
        ("http://0.0.0.0:5432/x", "unspecified"),
        ("http://224.0.0.1/x", "multicast"),
    ],
)
async def test_a_literal_internal_address_is_refused_at_submit_by_default(
    api: ApiServer, url: str, what: str
) -> None:
    http = await api.client()
    resp = await http.post("/v1/tasks", json={"kind": "sim", "input": {}, "callback_url": url})
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    detail = resp.json()["detail"]
    assert what in detail and "api.callback_hosts" in detail
    assert await api.fw.list_tasks() == []


async def test_a_name_that_resolves_inside_is_never_called(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """``localhost`` passes the submit (a name), and the delivery refuses it after resolving."""
    receiver = Receiver()
    url = (await serve_receiver(api_stack, receiver)).replace("127.0.0.1", "localhost")
    server = await start_api()
    http = await server.client()
    task = (
        await http.post("/v1/tasks", json={"kind": "sim", "input": {}, "callback_url": url})
    ).json()

    async def attempted() -> bool:
        return (await server.fw.get(task["id"])).callback_attempts >= 1

    await eventually(attempted)
    assert receiver.calls == []
    assert (await server.fw.get(task["id"])).callback_state == "pending"  # retried, DNS may move
