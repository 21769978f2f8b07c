"""``/v1/jobs``: multi-step jobs (docs/jobs.md): submit, read, list, cancel, retry, follow."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from floodway.api.auth import Tenant
from floodway.api.media import JSON_BODY, json_response
from floodway.api.openapi import problems
from floodway.api.routes.events import EVENT_STREAM
from floodway.api.routes.tasks import checked_id, read_cursor
from floodway.api.schemas import CALLBACK_URL_PATTERN, _In
from floodway.api.state import ApiState, api_state
from floodway.app import Floodway
from floodway.clock import event_set_within
from floodway.core.errors import JobNotFound, TaskNotFound
from floodway.core.jobs import Job, JobRequest, JobStatus
from floodway.core.task import Lane
from floodway.core.validation import MAX_DEADLINE_S
from floodway.wire.jobs import JobOut, job_json
from floodway.wire.tasks import timestamp

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

State = Annotated[ApiState, Depends(api_state)]


class StepIn(BaseModel):
    """One step. Checked by floodway itself, so that each refusal names the step."""

    # Unknown fields and wrong types are refused by the job's check, naming the step (a lax
    # model would read "yes" as true).
    model_config = ConfigDict(extra="allow")

    name: str = Field(description="unique in the job: 1-64 letters, digits, '_' or '-'")
    kind: str | None = Field(None, description="the kind of task the step runs (required)")
    input: Any = Field(
        None,
        description="(required) "
        "the task input; a string that is exactly ${steps.NAME.result.PATH}, "
        "${steps.NAME.results} (a for_each step's list of results), ${item} or ${index} "
        "is replaced by that value",
    )
    after: Any = Field(
        None,
        description="the steps that must end first",
        json_schema_extra={"type": "array", "items": {"type": "string"}},
    )
    for_each: Any = Field(
        None, description="a list, or ${steps.NAME.result.PATH} naming one: a task per item"
    )
    optional: Any = Field(
        None,
        description="if it fails, the job goes on and its dependants get null",
        json_schema_extra={"type": "boolean"},
    )


class JobIn(_In):
    steps: list[StepIn] = Field(min_length=1)
    lane: Lane = Lane.BACKGROUND
    deadline_s: float | None = Field(
        None,
        gt=0,
        le=MAX_DEADLINE_S,
        allow_inf_nan=False,
        description="the whole job's time limit, split across its remaining steps",
    )
    callback_url: str | None = Field(
        None,
        max_length=2048,
        pattern=CALLBACK_URL_PATTERN,
        description="an absolute http(s) URL, POSTed (signed) once when the job ends",
    )
    metadata: dict[str, Any] | None = None

    def request(self) -> JobRequest:
        steps = [s.model_dump(exclude_unset=True) for s in self.steps]
        return JobRequest(steps, self.lane, self.deadline_s, self.metadata, self.callback_url)


class JobSummaryOut(BaseModel):
    id: str
    status: JobStatus
    lane: Lane
    steps: list[str]
    error: dict[str, Any] | None = None
    created_at: datetime | None
    finished_at: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class JobPage(BaseModel):
    items: list[JobSummaryOut]
    next: str | None = Field(description="opaque cursor for the next page (pass as ?after=)")


def _summary(job: Job) -> JobSummaryOut:
    return JobSummaryOut(
        id=job.id,
        status=job.status,
        lane=job.lane,
        steps=[s.name for s in job.spec.steps],
        error=job.error,
        created_at=timestamp(job.created_at),
        finished_at=timestamp(job.finished_at),
        metadata=job.metadata,
    )


@router.post(
    "",
    status_code=202,
    response_model=JobOut,
    summary="Submit a multi-step job",
    dependencies=[JSON_BODY],
    responses=problems(401, 402, 415, 422, 429),
)
async def submit_job(body: JobIn, tenant: Tenant, state: State) -> Response:
    """Check the job (each refusal names its step: `invalid-job`), queue its first steps,
    answer at once (202)."""
    written = await state.fw.runtime.submit_job(body.request(), tenant=tenant, gate=state.gate)
    return json_response(job_json(*written), 202)


#: the name of this list in its cursors
LISTING = "jobs"


@router.get("", response_model=JobPage, summary="List jobs", responses=problems(400, 401, 422))
async def list_jobs(
    tenant: Tenant,
    state: State,
    status: JobStatus | None = None,
    order: Annotated[
        Literal["asc", "desc"], Query(description="`asc`: oldest first; `desc`: newest first")
    ] = "asc",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        str | None,
        Query(
            max_length=200,
            description="a page's `next` cursor (pass the same `order` with it)",
        ),
    ] = None,
) -> JobPage:
    """The caller's jobs, one page at a time (keyset pagination)."""
    cursors = await state.cursors()
    found = await state.fw.list_jobs(
        tenant=tenant,
        status=status,
        after_seq=read_cursor(cursors, tenant, after, LISTING) if after else None,
        limit=limit + 1,
        descending=order == "desc",
    )
    page = found[:limit]
    more = len(found) > limit
    return JobPage(
        items=[_summary(j) for j in page],
        next=cursors.encode(tenant, LISTING, page[-1].seq) if more and page else None,
    )


@router.get("/{job_id}", response_model=JobOut, summary="Get a job", responses=problems(401, 404))
async def get_job(job_id: str, tenant: Tenant, state: State) -> Response:
    """Its status, each step's tasks with their statuses, progress, and its result or error."""
    return json_response(await state.fw.get_job(_checked(job_id), tenant=tenant))


@router.delete(
    "/{job_id}", response_model=JobOut, summary="Cancel a job", responses=problems(401, 404, 409)
)
async def cancel_job(job_id: str, tenant: Tenant, state: State) -> Response:
    """Its tasks not yet sent are cancelled; one in flight is cancelled as a task's cancel
    does (its call read to its end and billed); no further step starts. Ended already: 409."""
    return json_response(await state.fw.cancel_job(_checked(job_id), tenant=tenant))


@router.post(
    "/{job_id}/retry",
    response_model=JobOut,
    summary="Retry a failed job: only its failed steps and what depends on them",
    responses=problems(401, 402, 404, 409),
)
async def retry_job(job_id: str, tenant: Tenant, state: State) -> Response:
    return json_response(await state.fw.retry_job(_checked(job_id), tenant=tenant))


def _checked(job_id: str) -> str:
    """An id that cannot exist is simply not found."""
    try:
        return checked_id(job_id)
    except TaskNotFound:
        raise JobNotFound(job_id[:64]) from None


def _event(seq: int, job: dict[str, Any]) -> str:
    data = json.dumps(job, separators=(",", ":"))
    return f"id: {seq}\nevent: job\ndata: {data}\n\n"


async def job_stream(
    fw: Floodway, job_id: str, tenant: str, recheck_s: float
) -> AsyncIterator[str]:
    """The job as GET shows it, each time it changed, ending after it ended."""
    hub = fw.runtime.hub
    changed = hub.watch_all()
    fw.follow_changes()
    last: str | None = None
    seq = 0
    try:
        while True:
            changed.clear()  # before reading, so a write during the read wakes us again
            job = await fw.get_job(job_id, tenant=tenant)
            shown = json.dumps({k: v for k, v in job.items() if k != "updated_at"})
            if shown != last:
                last, seq = shown, seq + 1
                yield _event(seq, job)
            if job["status"] != JobStatus.RUNNING:
                return
            if not await event_set_within(changed, recheck_s):
                yield ": keep-alive\n\n"
    finally:
        hub.unwatch_all(changed)


@router.get(
    "/{job_id}/events",
    summary="Follow a job (Server-Sent Events)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One `job` event (its data: the job as GET shows it) each time it "
            "changes; the stream ends after the one that shows it ended.",
            "content": {EVENT_STREAM: {"schema": {"type": "string"}}},
        },
        **problems(401, 404),
    },
)
async def job_events(job_id: str, tenant: Tenant, state: State) -> StreamingResponse:
    fw = state.fw
    await fw.get_job(_checked(job_id), tenant=tenant)  # a 404 before the stream starts
    return StreamingResponse(
        job_stream(fw, job_id, tenant, state.sse_recheck_s),
        media_type=EVENT_STREAM,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
