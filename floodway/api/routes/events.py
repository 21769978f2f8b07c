"""``GET /v1/tasks/{id}/events``: Server-Sent Events, one per status change, ending after the
terminal one, which carries the task as ``GET /v1/tasks/{id}`` answers it (its result or error:
no second request).

The stream is woken by this process's change hub the moment a status is written here; a slow
re-check covers writes by other processes (workers elsewhere in a fleet). An event's id is its
place among the task's own events (1, 2, 3...), never the ledger's global order, which would
tell a tenant how much every other tenant did meanwhile; ``Last-Event-ID`` resumes after it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header
from fastapi.responses import StreamingResponse

from floodway.api.auth import Tenant
from floodway.api.openapi import problems
from floodway.api.routes.tasks import checked_id
from floodway.api.state import ApiState, api_state
from floodway.app import Floodway
from floodway.clock import event_set_within
from floodway.core.errors import TaskNotFound
from floodway.core.states import TERMINAL
from floodway.core.task import Task
from floodway.store.base import TaskEvent
from floodway.wire.tasks import task_json, timestamp

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])

EVENT_STREAM = "text/event-stream"


def format_event(event: TaskEvent, place: int, ended: Task | None = None) -> str:
    """One ``status`` event, the task's ``place``-th; the last of a stream (``ended``) also
    holds the task's body."""
    at = timestamp(event.at)
    data: dict[str, object] = {
        "task_id": event.task_id,
        "status": event.status.value,
        "at": at.isoformat().replace("+00:00", "Z") if at else None,
        "attempt": event.attempt,
        "detail": event.detail,
    }
    if ended is not None:
        data["task"] = task_json(ended)
    return f"id: {place}\nevent: status\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def status_stream(
    fw: Floodway, task_id: str, after: int, recheck_s: float
) -> AsyncIterator[str]:
    """The task's events after its ``after``-th."""
    with fw.runtime.hub.watch(task_id) as watch:
        already = (await fw.events(task_id, 0))[:after] if after else []
        after_seq = already[-1].seq if already else 0
        place = len(already)
        while True:
            watch.clear()  # before reading, so a write during the read wakes us again
            batch = await fw.events(task_id, after_seq)
            ended = None
            if not batch or batch[-1].status in TERMINAL:
                # The stream ends only where the task has ended (a manual retry may have
                # queued it again since that terminal event), with the task as it ended.
                task = await _find(fw, task_id)
                if task is None:
                    return  # purged: nothing more will ever come
                if task.terminal:
                    # Its terminal event is written with its status: read up to it.
                    seen = batch[-1].seq if batch else after_seq
                    batch += await fw.events(task_id, seen)
                    if not batch:
                        # Resumed at (or past) the end: a browser's EventSource reconnects
                        # with the terminal event's id after every stream the server closed.
                        return
                    ended = task
            for event in batch:
                after_seq, place = event.seq, place + 1
                yield format_event(event, place, ended if event is batch[-1] else None)
            if ended is not None:
                return
            if not await event_set_within(watch.changed, recheck_s):
                if await _find(fw, task_id) is None:
                    return  # purged meanwhile: nothing more will ever come
                yield ": keep-alive\n\n"  # also keeps idle proxies from cutting the stream


async def _find(fw: Floodway, task_id: str) -> Task | None:
    try:
        return await fw.get(task_id)
    except TaskNotFound:
        return None


@router.get(
    "/{task_id}/events",
    summary="Follow a task's status changes (Server-Sent Events)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One `status` event per change; the stream ends after the terminal "
            "one. Each event's data: {task_id, status, at, attempt, detail}; the last one's "
            "also `task`: the task as GET /v1/tasks/{id} answers it (result, error, cost).",
            "content": {EVENT_STREAM: {"schema": {"type": "string"}}},
        },
        **problems(401, 404),
    },
)
async def task_events(
    task_id: str,
    tenant: Tenant,
    state: Annotated[ApiState, Depends(api_state)],
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", max_length=32, description="resume after it")
    ] = None,
) -> StreamingResponse:
    fw = state.fw
    await fw.get(checked_id(task_id), tenant=tenant)  # a 404 before the stream starts
    resume = last_event_id or ""
    after = int(resume) if resume.isascii() and resume.isdigit() else 0
    return StreamingResponse(
        status_stream(fw, task_id, min(after, 2**31), state.sse_recheck_s),
        media_type=EVENT_STREAM,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
