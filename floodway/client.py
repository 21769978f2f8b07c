"""An async client for a floodway server, over httpx.

::

    async with floodway.client.Client("http://127.0.0.1:8000", api_key="key-a") as fw:
        task = await fw.submit("summarize", {"text": "..."}, lane="interactive", key="doc-42")
        task = await fw.wait(task.id, timeout=60)

It returns the same :class:`floodway.Task` the library does, and raises the same errors
(mapped from the server's problem documents): :class:`~floodway.TaskNotFound`,
:class:`~floodway.AdmissionRefused` (with ``retry_after``), :class:`~floodway.IdempotencyConflict`,
:class:`~floodway.IllegalTransition`, :class:`~floodway.UnknownKind`,
:class:`~floodway.InvalidInput`, :class:`~floodway.WaitTimeout`; anything else is an
:class:`ApiError` carrying the status and the problem.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from floodway.core.backoff import Backoff
from floodway.core.errors import (
    FloodwayError,
    WaitTimeout,
)
from floodway.core.states import Status
from floodway.core.task import SubmitRequest, Submitted, Task
from floodway.wire.problems import error_from
from floodway.wire.tasks import epoch, submit_body, task_from_json

__all__ = ["ApiError", "BatchProgress", "BatchSubmitted", "Client", "Page", "StatusEvent"]

DEFAULT_URL = "http://127.0.0.1:8000"


class ApiError(FloodwayError):
    """The server answered an error that has no floodway exception of its own."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        self.type = str(problem.get("type", ""))
        self.title = str(problem.get("title", ""))
        self.detail = str(problem.get("detail", ""))
        super().__init__(f"{status} {self.title}: {self.detail}".rstrip(": "))


@dataclass(frozen=True)
class Page:
    items: list[Task]
    next: str | None  # pass as ``after=`` for the next page; None on the last one


@dataclass(frozen=True)
class BatchSubmitted:
    id: str
    task_ids: list[str]
    reused: bool = False


@dataclass(frozen=True)
class BatchProgress:
    id: str
    total: int
    counts: dict[str, int]
    done: bool


@dataclass(frozen=True)
class StatusEvent:
    seq: int
    task_id: str
    status: Status
    at: float | None
    attempt: int
    detail: str = ""
    #: on the stream's last event only: the task as it ended (what :meth:`Client.get` reads)
    task: Task | None = None


class Client:
    """``Client(base_url, api_key=None)``; use as ``async with`` or call :meth:`aclose`."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        backoff: Backoff | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        rng: random.Random | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )
        self.backoff = backoff or Backoff(base_s=0.25, cap_s=5.0)
        self._rng = rng

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- tasks --------------------------------------------------------------------------------
    async def submit(
        self,
        kind: str,
        input: Mapping[str, Any],
        *,
        lane: str = "background",
        key: str | None = None,
        max_attempts: int | None = None,
        deadline_s: float | None = None,
        callback_url: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        tier: str | None = None,
    ) -> Task:
        """Queue a task; returns at once (the task is usually ``queued``)."""
        request = SubmitRequest(
            kind,
            dict(input),
            lane=lane,
            key=key,
            max_attempts=max_attempts,
            deadline_s=deadline_s,
            callback_url=callback_url,
            metadata=dict(metadata) if metadata is not None else None,
            tier=tier,
        )
        return (await self.submit_request(request)).task

    async def submit_request(self, request: SubmitRequest) -> Submitted:
        """Like :meth:`submit`, and says whether the request key matched an earlier task."""
        body = submit_body(request)
        headers = {"Idempotency-Key": request.key} if request.key is not None else None
        data = await self._request("POST", "/v1/tasks", json=body, headers=headers)
        return Submitted(task_from_json(data), reused=bool(data.get("reused")))

    async def get(self, task_id: str) -> Task:
        return task_from_json(await self._request("GET", f"/v1/tasks/{_seg(task_id)}"))

    async def list_tasks(
        self,
        *,
        status: str | None = None,
        kind: str | None = None,
        lane: str | None = None,
        batch: str | None = None,
        limit: int = 100,
        after: str | None = None,
        newest_first: bool = False,
    ) -> Page:
        """One page of the caller's tasks, oldest first (``newest_first``: newest first); pass
        its ``next`` as ``after`` (with the same order) for the following page."""
        params = {
            "status": status,
            "kind": kind,
            "lane": lane,
            "batch": batch,
            "limit": limit,
            "after": after,
            "order": "desc" if newest_first else None,
        }
        data = await self._request(
            "GET", "/v1/tasks", params={k: v for k, v in params.items() if v is not None}
        )
        return Page([task_from_json(t) for t in data["items"]], data.get("next"))

    async def iter_tasks(
        self,
        *,
        status: str | None = None,
        kind: str | None = None,
        lane: str | None = None,
        batch: str | None = None,
        page_size: int = 100,
        newest_first: bool = False,
    ) -> AsyncIterator[Task]:
        """Every matching task, page after page."""
        after: str | None = None
        while True:
            page = await self.list_tasks(
                status=status,
                kind=kind,
                lane=lane,
                batch=batch,
                limit=page_size,
                after=after,
                newest_first=newest_first,
            )
            for task in page.items:
                yield task
            if page.next is None:
                return
            after = page.next

    async def cancel(self, task_id: str) -> Task:
        return task_from_json(await self._request("DELETE", f"/v1/tasks/{_seg(task_id)}"))

    async def retry(self, task_id: str) -> Task:
        return task_from_json(await self._request("POST", f"/v1/tasks/{_seg(task_id)}/retry"))

    # -- jobs ---------------------------------------------------------------------------------
    async def submit_job(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/jobs`` with ``body`` (``{"steps": [...], ...}``): the job, as plain data."""
        job: dict[str, Any] = await self._request("POST", "/v1/jobs", json=body)
        return job

    async def get_job(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = await self._request("GET", f"/v1/jobs/{_seg(job_id)}")
        return job

    async def cancel_job(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = await self._request("DELETE", f"/v1/jobs/{_seg(job_id)}")
        return job

    async def retry_job(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = await self._request("POST", f"/v1/jobs/{_seg(job_id)}/retry")
        return job

    async def wait_job(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Until the job has ended, following its event stream (again, if it breaks)."""
        url = f"/v1/jobs/{_seg(job_id)}/events"
        async with asyncio.timeout(timeout):
            while True:
                async with self._http.stream("GET", url, timeout=None) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise_for_problem(response)
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            job: dict[str, Any] = json.loads(line.removeprefix("data: "))
                            if job["status"] != "running":
                                return job

    # -- batches ------------------------------------------------------------------------------
    async def batch(
        self,
        tasks: Sequence[Mapping[str, Any]] | None = None,
        *,
        kind: str | None = None,
        inputs: Sequence[Mapping[str, Any]] | None = None,
        lane: str = "background",
        key: str | None = None,
    ) -> BatchSubmitted:
        """Submit many tasks in one transaction: ``tasks`` as submit bodies
        (``{"kind", "input", ...}``), or ``kind=`` with a list of ``inputs``."""
        if tasks is None:
            if kind is None or inputs is None:
                raise ValueError("give tasks=[...] or kind= and inputs=[...]")
            tasks = [{"kind": kind, "input": dict(i), "lane": lane} for i in inputs]
        headers = {"Idempotency-Key": key} if key is not None else None
        data = await self._request(
            "POST", "/v1/batches", json={"tasks": [dict(t) for t in tasks]}, headers=headers
        )
        return BatchSubmitted(data["id"], list(data["task_ids"]), bool(data.get("reused")))

    async def batch_status(self, batch_id: str) -> BatchProgress:
        data = await self._request("GET", f"/v1/batches/{_seg(batch_id)}")
        return BatchProgress(data["id"], data["total"], dict(data["counts"]), data["done"])

    # -- operations ---------------------------------------------------------------------------
    async def kinds(self) -> list[dict[str, Any]]:
        """The kinds the server runs: name, resource, attempts, deadline, timeout, models."""
        data = await self._request("GET", "/v1/kinds")
        return list(data["kinds"])

    async def stats(self) -> dict[str, Any]:
        return dict(await self._request("GET", "/v1/stats"))

    async def spend(
        self,
        *,
        tenant: str | None = None,
        kind: str | None = None,
        since: str | None = None,
        bucket: str | None = None,
    ) -> dict[str, Any]:
        """``GET /v1/spend``: cost and savings per tenant and kind, a series, budgets.
        ``since``: how far back from now ("24h", "7d")."""
        params = {"tenant": tenant, "kind": kind, "since": since, "bucket": bucket}
        query = {k: v for k, v in params.items() if v is not None}
        return dict(await self._request("GET", "/v1/spend", params=query))

    async def healthz(self) -> dict[str, Any]:
        return dict(await self._request("GET", "/healthz"))

    # -- waiting ------------------------------------------------------------------------------
    async def events(self, task_id: str, *, after: int | None = None) -> AsyncIterator[StatusEvent]:
        """The task's status changes as they happen (Server-Sent Events); ends at terminal,
        the last event holding the ended task."""
        headers = {"Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = str(after)
        url = f"/v1/tasks/{_seg(task_id)}/events"
        async with self._http.stream("GET", url, headers=headers) as response:
            if not response.is_success:
                await response.aread()
                raise_for_problem(response)
            async for event in _parse_sse(response.aiter_lines()):
                yield event

    async def wait(self, task_id: str, timeout: float | None = None) -> Task:
        """Until the task is terminal: follows its event stream, and when the stream cannot be
        had (a proxy, a restart) polls with full-jitter backoff, resuming the stream after."""
        try:
            async with asyncio.timeout(timeout):
                return await self._wait(task_id)
        except TimeoutError:
            raise WaitTimeout(f"task {task_id} not finished after {timeout}s") from None

    async def _wait(self, task_id: str) -> Task:
        failures = 0
        last_seq = 0
        while True:
            progressed = False
            try:
                async for event in self.events(task_id, after=last_seq):
                    last_seq, progressed = event.seq, True
                    if event.task is not None and event.task.terminal:
                        return event.task
            except (httpx.TransportError, httpx.DecodingError):
                pass  # the stream broke: poll below, then follow it again
            except ApiError as exc:
                if exc.status < 500:
                    raise
            # A stream that broke, or ended without news, backs off before the next try.
            failures = 0 if progressed else failures + 1
            task = await self.get(task_id)
            if task.terminal:
                return task
            if failures:
                await asyncio.sleep(self.backoff.delay(failures, self._rng))

    # -- plumbing -----------------------------------------------------------------------------
    async def _request(self, method: str, url: str, **kwargs: Any) -> Any:
        response = await self._http.request(method, url, **kwargs)
        raise_for_problem(response)
        return response.json()


def raise_for_problem(response: httpx.Response) -> None:
    """Raise the floodway error a problem document describes (no-op on success): the class
    the library raises for the same error, else :class:`ApiError`."""
    if response.is_success:
        return
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        problem = {"title": response.reason_phrase, "detail": response.text[:500]}
    error = error_from(
        problem, response.status_code, response.headers.get("retry-after"), time.time()
    )
    raise error if error is not None else ApiError(response.status_code, problem)


def _seg(value: str) -> str:
    """A path segment, escaped so an id can never reach another route."""
    return quote(value, safe="")


async def _parse_sse(lines: AsyncIterator[str]) -> AsyncIterator[StatusEvent]:
    """Server-Sent Events framing: fields until a blank line; comments start with ':'."""
    seq, data = "", list[str]()
    async for line in lines:
        if line == "":
            if data:
                payload = json.loads("\n".join(data))
                yield StatusEvent(
                    seq=int(seq) if seq.isdigit() else 0,
                    task_id=payload["task_id"],
                    status=Status(payload["status"]),
                    at=epoch(payload.get("at")),
                    attempt=int(payload.get("attempt", 0)),
                    detail=str(payload.get("detail", "")),
                    task=task_from_json(ended)
                    if isinstance(ended := payload.get("task"), dict)
                    else None,
                )
            seq, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            seq = value
        elif name == "data":
            data.append(value)
