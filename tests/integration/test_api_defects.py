"""Wrong answers the API gave to a user or an adversary, each pinned by the answer it owes.

Split deployment callbacks, resumed event streams, a forged signature with odd bytes, NUL
characters on PostgreSQL, a batch key replayed with another list, callback URLs that cannot be
delivered to, and statistics that told one tenant about everyone.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import psycopg
import pytest

from floodway import Floodway, Settings, Status
from floodway.api import create_app, serving
from floodway.config import ApiConfig, KindConfig
from floodway.core import changes
from floodway.core.task import ErrorClass, ErrorInfo
from floodway.store.base import ClaimParams
from floodway.testing import SimulatedProvider
from harness.fleet import PG_URL, fresh_database
from tests.integration.conftest import ApiServer, StartApi, eventually
from tests.integration.test_api_webhooks_out import Receiver, serve_receiver

KEYS = {"key-a": "a", "key-b": "b"}
ADMIN = {"key-ops": "ops"}


async def test_callbacks_are_delivered_when_the_api_runs_no_workers(
    tmp_path: Path, api_stack: AsyncExitStack
) -> None:
    """``floodway api`` + ``floodway worker``: the worker's maintenance delivers them."""
    database = f"sqlite:///{tmp_path}/split.db"
    # the receiver listens on loopback, which only a listed host may be
    local = ApiConfig(callback_hosts=["127.0.0.1"])
    api_side = Floodway(settings=Settings(database=database, api=local))
    api_side.kind("sim")(SimulatedProvider().handler)
    worker_side = Floodway(settings=Settings(database=database, api=local))
    worker_side.kind("sim")(SimulatedProvider().handler)
    receiver = Receiver()
    hook = await serve_receiver(api_stack, receiver)
    url = await api_stack.enter_async_context(serving(create_app(api_side, run_workers=False)))
    await api_stack.enter_async_context(worker_side)
    await api_stack.enter_async_context(worker_side.worker(concurrency=2))
    async with httpx.AsyncClient(base_url=url) as http:
        sent = await http.post(
            "/v1/tasks", json={"kind": "sim", "input": {"n": 1}, "callback_url": hook}
        )
        assert sent.status_code == 202
        await asyncio.wait_for(receiver.got_one.wait(), 20)
    (headers, body) = receiver.calls[0]
    assert sent.json()["id"].encode() in body and headers["webhook-id"].startswith("msg_")


async def test_a_stream_resumed_at_its_end_ends_at_once(api: ApiServer) -> None:
    http = await api.client()
    task = (await http.post("/v1/tasks", json={"kind": "sim", "input": {"n": 2}})).json()

    async def ended() -> bool:
        return (await api.fw.get(task["id"])).terminal

    await eventually(ended)
    events = await api.fw.store.events(task["id"])
    last = events[-1].seq
    for resume_at in (last, last + 1000):
        async with asyncio.timeout(5):  # before the fix: keep-alives until the row was purged
            answer = await http.get(
                f"/v1/tasks/{task['id']}/events", headers={"Last-Event-ID": str(resume_at)}
            )
        assert answer.status_code == 200 and "event:" not in answer.text


async def test_a_signature_with_non_ascii_bytes_is_refused_not_a_500(
    start_api: StartApi,
) -> None:
    server = await start_api(
        run_workers=False,
        kinds={"hooked": KindConfig(adapter="python", webhook_secret="s")},
        handlers={"hooked": SimulatedProvider().handler},
    )
    http = await server.client()
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(server.fw.clock.now())),
        "webhook-signature": "v1,café".encode(),
        "content-type": "application/json",
    }
    answer = await http.post("/v1/webhooks/hooked", content=b"{}", headers=headers)
    assert answer.status_code == 401 and answer.json()["type"].endswith("invalid-signature")


async def test_a_batch_key_replayed_with_another_list_is_a_conflict(api: ApiServer) -> None:
    http = await api.client()
    tasks = [{"kind": "sim", "input": {"n": i}} for i in range(3)]
    key = {"Idempotency-Key": "batch-1"}
    first = await http.post("/v1/batches", json={"tasks": tasks}, headers=key)
    same = await http.post("/v1/batches", json={"tasks": tasks}, headers=key)
    longer = await http.post("/v1/batches", json={"tasks": [*tasks, tasks[0]]}, headers=key)
    shorter = await http.post("/v1/batches", json={"tasks": tasks[:2]}, headers=key)
    assert first.status_code == 202 and same.status_code == 200
    assert same.json()["task_ids"] == first.json()["task_ids"]
    assert longer.status_code == 409 and shorter.status_code == 409
    assert len(await api.fw.list_tasks()) == 3  # nothing was added


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999/x", "http://[:::::::]/x", "http://example.com:0/x"]
)
async def test_a_callback_url_nobody_can_be_reached_at_is_refused(api: ApiServer, url: str) -> None:
    http = await api.client()
    answer = await http.post("/v1/tasks", json={"kind": "sim", "input": {}, "callback_url": url})
    assert answer.status_code == 422 and "callback_url" in answer.json()["detail"]
    assert await api.fw.list_tasks() == []


async def test_a_tenant_sees_its_own_statistics_and_an_operator_everyone_s(
    start_api: StartApi,
) -> None:
    server = await start_api(keys=KEYS, api={"admin_keys": ADMIN}, run_workers=False)
    a, b, ops = [await server.client(k) for k in ("key-a", "key-b", "key-ops")]
    for _ in range(3):
        await a.post("/v1/tasks", json={"kind": "sim", "input": {"n": uuid.uuid4().hex}})
    await b.post("/v1/tasks", json={"kind": "sim", "input": {"n": 1}})
    seen_by_b = (await b.get("/v1/stats")).json()
    assert seen_by_b["tasks"]["queued"] == 1 and seen_by_b["by_kind"] == {"sim": {"queued": 1}}
    assert seen_by_b["resources"] == {} and seen_by_b["upstream"] == {}
    assert seen_by_b["tenant"] == "b"  # the dashboard says whose view it shows
    seen_by_ops = (await ops.get("/v1/stats")).json()
    assert seen_by_ops["tasks"]["queued"] == 4 and seen_by_ops["tenant"] is None
    assert (await b.get("/metrics")).status_code == 403
    metrics = await ops.get("/metrics")
    assert metrics.status_code == 200 and 'floodway_tasks{status="queued"} 4.0' in metrics.text


async def test_metrics_on_their_own_listener_need_no_key(
    tmp_path: Path, api_stack: AsyncExitStack
) -> None:
    port = _free_port()
    settings = Settings(
        database=f"sqlite:///{tmp_path}/m.db",
        api=ApiConfig(keys=KEYS, metrics_port=port),
    )
    fw = Floodway(settings=settings)
    fw.kind("sim")(SimulatedProvider().handler)
    url = await api_stack.enter_async_context(serving(create_app(fw)))
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{url}/metrics")).status_code == 401
        private = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert private.status_code == 200 and "floodway_tasks" in private.text


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize(
    "path", ["/v1/tasks?kind=%00", "/v1/batches/b%00x", "/v1/tasks/t_%00", "/v1/tasks?after=%00"]
)
async def test_a_nul_on_postgres_is_bad_input_not_an_outage(
    api_stack: AsyncExitStack, path: str
) -> None:
    """PostgreSQL text cannot hold NUL: a 503 "store unavailable" had clients retry forever."""
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {PG_URL} is unavailable: {exc}")
    async with fresh_database() as database:
        fw = Floodway(settings=Settings(database=database))
        fw.kind("sim")(SimulatedProvider().handler)
        async with AsyncExitStack() as stack:
            url = await stack.enter_async_context(serving(create_app(fw)))
            async with httpx.AsyncClient(base_url=url) as http:
                answer = await http.get(path)
    assert answer.status_code in (400, 404, 422), answer.text
    assert "retry-after" not in answer.headers


async def test_a_retry_while_the_last_call_may_still_run_says_when_to_ask_again(
    start_api: StartApi,
) -> None:
    """A 409 of its own type with Retry-After: the call a dead worker left ends by then."""
    server = await start_api(run_workers=False)
    fw = server.fw
    task = await fw.submit("sim", {"n": 7})
    now = fw.clock.now()
    (claimed,) = await fw.store.claim(
        ClaimParams("host:1:dead:w1", "tok", ("sim",), 1, now, 30, ids=(task.id,))
    )
    interrupted = ErrorInfo(ErrorClass.INTERRUPTED, "worker_lost", "the worker died")
    item = changes.orphaned(claimed, Status.FAILED, interrupted, now + 90)
    assert (await fw.store.complete([item], now))[0].applied
    http = await server.client()
    answer = await http.post(f"/v1/tasks/{task.id}/retry")
    assert answer.status_code == 409
    problem = answer.json()
    assert problem["type"] == "urn:floodway:problem:attempt-still-open"
    assert 80 <= problem["retry_after"] <= 90 and 80 <= int(answer.headers["retry-after"]) <= 90
    assert (await fw.get(task.id)).status is Status.FAILED
