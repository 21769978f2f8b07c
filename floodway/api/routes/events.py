"""``GET /v1/tasks/{id}/events``: Server-Sent Events, one per status change, ending after the
terminal one.

The stream is woken by this process's change hub the moment a status is written here; a slow
re-check covers writes by other processes (workers elsewhere in a fleet). ``Last-Event-ID``
resumes after the last event a client saw.
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
from floodway.core.states import TERMINAL
from floodway.store.base import TaskEvent
from floodway.wire.tasks import timestamp

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])

EVENT_STREAM = "text/event-stream"


def format_event(event: TaskEvent) -> str:
    at = timestamp(event.at)
    data = {
        "task_id": event.task_id,
        "status": event.status.value,
        "at": at.isoformat().replace("+00:00", "Z") if at else None,
        "attempt": event.attempt,
        "detail": event.detail,
    }
    return f"id: {event.seq}\nevent: status\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def status_stream(
    fw: Floodway, task_id: str, after_seq: int, recheck_s: float
) -> AsyncIterator[str]:
    hub = fw.runtime.hub
    changed = hub.watch(task_id)
    try:
        while True:
            changed.clear()  # before reading, so a write during the read wakes us again
            batch = await fw.events(task_id, after_seq)
            for event in batch:
                after_seq = event.seq
                yield format_event(event)
            if batch and batch[-1].status in TERMINAL:
                return
            if not batch:
                # Resumed at (or past) the end: a browser's EventSource reconnects with the
                # terminal event's id after every stream the server closed.
                task = await fw.store.get(task_id)
                if task is None or task.terminal:
                    for event in await fw.events(task_id, after_seq):  # it just ended
                        yield format_event(event)
                    return
            if not await event_set_within(changed, recheck_s):
                if await fw.store.get(task_id) is None:
                    return  # purged meanwhile: nothing more will ever come
                yield ": keep-alive\n\n"  # also keeps idle proxies from cutting the stream
    finally:
        hub.unwatch(task_id, changed)


@router.get(
    "/{task_id}/events",
    summary="Follow a task's status changes (Server-Sent Events)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One `status` event per change; the stream ends after the terminal "
            "one. Each event's data: {task_id, status, at, attempt, detail}.",
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
        status_stream(fw, task_id, min(after, 2**62), state.sse_recheck_s),
        media_type=EVENT_STREAM,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
