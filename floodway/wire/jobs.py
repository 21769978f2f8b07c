"""A job as it crosses HTTP (and as the library hands it out: the same plain data)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from floodway.core.jobs import Job, JobState, JobStatus, StepStatus, progress, step_status
from floodway.core.states import Status
from floodway.core.task import Lane
from floodway.wire.tasks import printable, timestamp


class JobTaskOut(BaseModel):
    id: str
    index: int = Field(description="its item's place in the for_each list (0 without one)")
    status: Status


class JobStepOut(BaseModel):
    name: str
    kind: str
    after: list[str]
    optional: bool
    fans_out: bool = Field(description="the step has a for_each: one task per item")
    status: StepStatus
    tasks: list[JobTaskOut]


class JobProgressOut(BaseModel):
    steps: int
    steps_done: int
    tasks: int = Field(description="tasks written so far (a for_each adds its own when it starts)")
    tasks_done: int


class JobOut(BaseModel):
    id: str
    status: JobStatus
    lane: Lane
    tenant: str
    result: Any = Field(None, description="the results of the steps nothing depends on, by step")
    error: dict[str, Any] | None = Field(
        None, description="why it failed or stopped: the step, its task, the task's error"
    )
    progress: JobProgressOut
    steps: list[JobStepOut]
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    deadline_at: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    callback_url: str | None = None


def job_out(job: Job, state: JobState) -> JobOut:
    steps = [
        JobStepOut(
            name=s.name,
            kind=s.kind,
            after=list(s.after),
            optional=s.optional,
            fans_out=s.fans_out,
            status=step_status(s, state),
            tasks=[
                JobTaskOut(id=t.task_id, index=t.index, status=t.status)
                for t in state.instances(s.name)
            ],
        )
        for s in job.spec.steps
    ]
    done = progress(job.spec, state)
    return JobOut(
        id=job.id,
        status=job.status,
        lane=job.lane,
        tenant=job.tenant,
        result=printable(job.result),
        error=job.error,
        progress=JobProgressOut(**done.to_json()),
        steps=steps,
        created_at=_at(job.created_at),
        updated_at=_at(job.updated_at),
        finished_at=timestamp(job.finished_at),
        deadline_at=timestamp(job.deadline_at),
        metadata=job.metadata,
        callback_url=job.callback_url,
    )


def _at(value: float) -> datetime:
    at = timestamp(value)
    assert at is not None  # the ledger's own clock wrote it
    return at


def job_json(job: Job, state: JobState) -> dict[str, Any]:
    """A job as the API, the library and a job's callback see it, ready for ``json.dumps``."""
    return job_out(job, state).model_dump(mode="json")
