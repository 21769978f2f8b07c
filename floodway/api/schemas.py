"""Wire schemas: what crosses HTTP, kept apart from the domain dataclasses so the contract in
DESIGN section 2 changes only on purpose."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from floodway.core.states import CLAIMABLE, Status
from floodway.core.task import Lane, Task

#: a deadline longer than this is a typo, and unbounded floats would overflow the timestamps
MAX_DEADLINE_S = 366 * 86400.0
MAX_ATTEMPTS = 1000
MAX_BATCH = 1000
#: absolute http(s) URL: a host name or IPv4 (or a bracketed IPv6), an optional port and path
CALLBACK_URL_PATTERN = (
    r"^https?://([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?([/?#][\x21-\x7e]*)?$"
)


def valid_unicode(value: Any) -> bool:
    if isinstance(value, str):
        if value.isascii():
            return True
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(valid_unicode(k) and valid_unicode(v) for k, v in value.items())
    if isinstance(value, list):
        return all(valid_unicode(v) for v in value)
    return True


def printable(value: Any) -> Any:
    """``value`` with any lone surrogate replaced, so it can be answered as JSON (a handler or a
    provider may have produced one; the ledger stores it escaped)."""
    if valid_unicode(value):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable(v) for v in value]
    return value


class _In(BaseModel):
    # A misspelt field is an error, not silently ignored (DESIGN invariant 5).
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        # JSON may escape a lone surrogate ("\ud800"), which no UTF-8 text can hold: refused
        # here, before it reaches a fingerprint, a database or an answer that would echo it.
        if not valid_unicode(data):
            raise ValueError("the body holds a lone surrogate escape: not valid Unicode text")
        return data


class SubmitIn(_In):
    kind: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(description="the task input: a JSON object")
    lane: Lane = Lane.BACKGROUND
    max_attempts: int | None = Field(None, ge=1, le=MAX_ATTEMPTS)
    deadline_s: float | None = Field(None, gt=0, le=MAX_DEADLINE_S, allow_inf_nan=False)
    # Kept verbatim, not normalised: it is part of the Idempotency-Key request hash.
    callback_url: str | None = Field(
        None,
        max_length=2048,
        pattern=CALLBACK_URL_PATTERN,
        description="an absolute http(s) URL, POSTed (signed) when the task ends",
    )
    metadata: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _json_numbers(cls, data: Any) -> Any:
        # JSON numbers only: `true` is not 1 attempt and "60" is not sixty seconds (pydantic's
        # lax mode would take both), while 3.0 is the integer 3, as JSON Schema has it.
        if isinstance(data, dict):
            for name in ("max_attempts", "deadline_s"):
                if isinstance(data.get(name), bool | str | bytes):
                    raise ValueError(f"{name} must be a JSON number")
        return data


class BatchIn(_In):
    tasks: list[SubmitIn] = Field(min_length=1, max_length=MAX_BATCH)


class ErrorOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    cls: str = Field(alias="class", description="retryable, fatal, poison, interrupted, ...")
    type: str
    message: str


class CostOut(BaseModel):
    estimated: float
    actual: float | None = None


class TaskOut(BaseModel):
    id: str
    kind: str
    status: Status
    lane: Lane
    tenant: str
    input: Any
    result: Any = None
    error: ErrorOut | None = None
    attempts: int
    max_attempts: int
    idempotency_key: str | None = None
    duplicate_of: str | None = None
    upstream_ref: str | None = None
    cost: CostOut
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    deadline_at: datetime | None = None
    next_attempt_at: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class SubmitOut(TaskOut):
    reused: bool = Field(description="true when the Idempotency-Key matched an earlier task")


class TaskPage(BaseModel):
    items: list[TaskOut]
    next: str | None = Field(description="opaque cursor for the next page (pass as ?after=)")


class BatchOut(BaseModel):
    id: str
    task_ids: list[str]
    reused: bool = False


class BatchStatus(BaseModel):
    id: str
    total: int
    counts: dict[str, int]
    done: bool


class TimingOut(BaseModel):
    count: int
    mean_s: float | None
    p50_s: float | None
    p95_s: float | None


class StatsOut(BaseModel):
    tasks: dict[str, int] = Field(description="tasks per status, all tenants")
    by_kind: dict[str, dict[str, int]]
    window: int = Field(description="how many of the newest tasks the timings cover")
    queue_wait: TimingOut
    completion: TimingOut
    retries: int = Field(description="attempts beyond the first, over the window")
    retrying: int
    dead_letters: int
    resources: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per resource: `limits` (each dimension's limit in force: value, source "
        "configured | header | learned, and the configured, published and learned figures; "
        "rates per minute), `in_flight`, `sending_per_min`, `paused_for`, 429s split into "
        "`throttles_limit` and `throttles_noise`, `pauses`, and `held_back_by`: what held "
        "candidates back in the last admission pass (concurrency, requests, tokens, pause, "
        "tenant cap)",
    )
    upstream: dict[str, float] = Field(
        default_factory=dict,
        description="this process's provider calls: calls, throttled (429), server_errors "
        "(5xx), their rates, polls and poll_idle_ratio",
    )


class HealthOut(BaseModel):
    status: Literal["ok"]
    version: str


class WebhookAck(BaseModel):
    status: Literal["applied", "ignored"]
    task_id: str
    task_status: Status


def timestamp(value: float | None) -> datetime | None:
    if value is None or not math.isfinite(value):
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None  # out of datetime's range: better absent than a 500


def task_out(task: Task) -> TaskOut:
    return TaskOut(
        id=task.id,
        kind=task.kind,
        status=task.status,
        lane=task.lane,
        tenant=task.tenant,
        input=printable(task.input),
        result=printable(task.result),
        error=None
        if task.error is None
        else ErrorOut(
            cls=task.error.cls.value,
            type=printable(task.error.type),
            message=printable(task.error.message),
        ),
        attempts=task.attempts,
        max_attempts=task.max_attempts,
        idempotency_key=task.idempotency_key,
        duplicate_of=task.duplicate_of,
        upstream_ref=printable(task.upstream_ref),
        cost=CostOut(estimated=task.cost_estimated, actual=task.cost_actual),
        created_at=timestamp(task.created_at) or datetime.fromtimestamp(0, UTC),
        updated_at=timestamp(task.updated_at) or datetime.fromtimestamp(0, UTC),
        started_at=timestamp(task.started_at),
        finished_at=timestamp(task.finished_at),
        deadline_at=timestamp(task.deadline_at),
        # Stored for every row, but only meaningful while the task waits for its next run.
        next_attempt_at=timestamp(task.next_attempt_at)
        if task.status in CLAIMABLE or task.parked
        else None,
        metadata=printable(dict(task.metadata)),
    )


def task_json(task: Task, **extra: Any) -> dict[str, Any]:
    """The Task JSON of DESIGN section 2, ready for ``json.dumps``."""
    body = task_out(task).model_dump(mode="json", by_alias=True)
    body.update(extra)
    return body
