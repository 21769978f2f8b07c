"""``floodway.client.Client`` against a real server: the library's verbs and errors over HTTP."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from floodway.client import ApiError, Client, raise_for_problem
from floodway.core.backoff import Backoff
from floodway.core.errors import (
    AdmissionRefused,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    TaskNotFound,
    UnknownKind,
    WaitTimeout,
)
from floodway.core.states import Status
from floodway.core.task import ErrorClass, Lane, SubmitRequest
from tests.integration.conftest import ApiServer, StartApi, eventually


async def test_submit_get_wait_list_cancel_retry(api: ApiServer) -> None:
    async with Client(api.url) as client:
        task = await client.submit("sim", {"p": 1}, lane="interactive", metadata={"who": "me"})
        assert task.status is Status.QUEUED and task.lane is Lane.INTERACTIVE
        assert task.tenant == "default" and task.metadata == {"who": "me"}
        done = await client.wait(task.id, timeout=20)
        assert done.status is Status.SUCCEEDED and done.result["echo"] == {"p": 1}
        assert done.finished_at is not None and done.finished_at >= done.created_at
        assert (await client.get(task.id)).status is Status.SUCCEEDED

        failed = await client.wait((await client.submit("sim", {"fail": "refusal"})).id, 20)
        assert failed.status is Status.FAILED
        assert failed.error is not None and failed.error.cls is ErrorClass.FATAL
        again = await client.retry(failed.id)
        assert again.id == failed.id and again.status in (Status.QUEUED, Status.RUNNING)

        page = await client.list_tasks(limit=1)
        assert [t.id for t in page.items] == [task.id] and page.next is not None
        everything = [t.id async for t in client.iter_tasks(page_size=1)]
        assert everything == [task.id, failed.id]
        assert [t.id async for t in client.iter_tasks(status="succeeded")] == [task.id]

        with pytest.raises(IllegalTransition):
            await client.cancel(task.id)
        with pytest.raises(TaskNotFound):
            await client.get("t_NOPE")

        assert (await client.healthz())["status"] == "ok"
        stats = await client.stats()
        assert stats["tasks"]["succeeded"] >= 1


async def test_idempotent_submit_batches_and_errors(start_api: StartApi) -> None:
    server = await start_api(run_workers=False, tenants={"interactive_depth": 1})
    async with Client(server.url) as client:
        first = await client.submit_request(SubmitRequest("sim", {"k": 1}, key="k-1"))
        again = await client.submit_request(SubmitRequest("sim", {"k": 1}, key="k-1"))
        assert not first.reused and again.reused and again.task.id == first.task.id
        with pytest.raises(IdempotencyConflict) as conflict:
            await client.submit("sim", {"k": 2}, key="k-1")
        assert conflict.value.task_id == first.task.id

        batch = await client.batch(kind="sim", inputs=[{"i": 1}, {"i": 2}])
        assert len(batch.task_ids) == 2
        progress = await client.batch_status(batch.id)
        assert progress.total == 2 and progress.counts["queued"] == 2 and not progress.done
        cancelled = await client.cancel(batch.task_ids[0])
        assert cancelled.status is Status.CANCELLED

        with pytest.raises(UnknownKind):
            await client.submit("nope", {})
        with pytest.raises(ApiError) as invalid:
            await client.submit("sim", {}, lane="sideways")
        assert invalid.value.status == 422 and invalid.value.type.endswith("validation-error")
        await client.submit("sim", {"i": 1}, lane="interactive")
        with pytest.raises(AdmissionRefused) as refused:
            await client.submit("sim", {"i": 2}, lane="interactive")
        assert refused.value.limit == "interactive_depth" and refused.value.retry_after > 0
        with pytest.raises(WaitTimeout):
            await client.wait(first.task.id, timeout=0.2)  # no workers: it never ends


async def test_keys_and_invalid_input(start_api: StartApi) -> None:
    server = await start_api(keys={"key-a": "a"}, run_workers=False)
    async with Client(server.url) as anonymous, Client(server.url, api_key="key-a") as client:
        with pytest.raises(ApiError) as unauthorized:
            await anonymous.list_tasks()
        assert unauthorized.value.status == 401
        task = await client.submit("sim", {"ok": True})
        assert task.tenant == "a"
    raw = httpx.Response(422, json={"type": "urn:floodway:problem:invalid-input", "detail": "no"})
    with pytest.raises(InvalidInput, match="no"):
        raise_for_problem(raw)


async def _at_least(transport: BrokenStreams, streams: int) -> bool:
    return transport.streams >= streams


class BrokenStreams(httpx.AsyncBaseTransport):
    """Fails every event-stream request (a proxy that buffers SSE, say); the rest go through."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.streams = 0
        self.polls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            self.streams += 1
            raise httpx.ConnectError("no streams through here", request=request)
        self.polls += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_wait_falls_back_to_polling_when_streams_fail(start_api: StartApi) -> None:
    server = await start_api(run_workers=False)
    transport = BrokenStreams()
    fast = Backoff(base_s=0.01, cap_s=0.05)
    async with Client(server.url, transport=transport, backoff=fast) as client:
        task = await client.submit("sim", {"slow": 1})
        waiter = asyncio.create_task(client.wait(task.id, timeout=20))
        await eventually(check=lambda: _at_least(transport, 3))  # it polled a few times
        await server.fw.cancel(task.id)
        done = await waiter
    assert done.status is Status.CANCELLED
    assert transport.polls >= 3


class Counting(httpx.AsyncBaseTransport):
    """Passes every request on, counting them by method and path."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seen: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_wait_takes_the_ended_task_from_the_last_event(start_api: StartApi) -> None:
    server = await start_api()
    transport = Counting()
    async with Client(server.url, transport=transport) as client:
        task = await client.submit("sim", {"w": 1})
        done = await client.wait(task.id, timeout=20)
        assert done.status is Status.SUCCEEDED and done.result is not None
        assert done == await client.get(task.id)
    reads = [seen for seen in transport.seen if seen == ("GET", f"/v1/tasks/{task.id}")]
    assert reads == [("GET", f"/v1/tasks/{task.id}")]  # the test's own read, not wait's
