"""The Task as it crosses HTTP, both ways: the server writes it (:func:`task_json`), the
client reads it back (:func:`task_from_json`). One module, so the two cannot drift apart; the
field names here are the public contract."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from floodway.core.states import CLAIMABLE, Status
from floodway.core.task import ErrorClass, ErrorInfo, Lane, SubmitRequest, Task


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


class ErrorOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    cls: str = Field(alias="class", description="retryable, fatal, poison, interrupted, ...")
    type: str
    message: str


class CostOut(BaseModel):
    # Two units side by side: what the limits meter (tokens, calls, images: the resource's
    # unit) and what budgets count (money, at the kind's prices).
    estimated: float = Field(
        description="the kind's estimate in the resource's metered unit (not money)"
    )
    actual: float | None = Field(None, description="what its calls used, in the same unit")
    held: float = Field(
        0.0,
        description="money: its estimate priced, what a budget admitted it at (0 when deduped:"
        " it never calls)",
    )
    over_estimate: float = Field(
        0.0, description="money: what its calls cost above what it was admitted at"
    )


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
    upstream_request_id: str | None = Field(
        None,
        description="the provider's id of its answer to the task's last call (OpenAI's"
        " x-request-id, Anthropic's request-id); a deduped task's is the one of the call whose"
        " result it took",
    )
    cost: CostOut
    #: the provider tier it is sent on: "sync", "flex" or "batch" (null: not chosen yet)
    tier: str | None = None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    deadline_at: datetime | None = None
    next_attempt_at: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


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
        idempotency_key=task.request_key,
        duplicate_of=task.duplicate_of,
        upstream_ref=printable(task.upstream_ref),
        upstream_request_id=printable(task.upstream_request_id),
        cost=CostOut(
            estimated=task.cost_estimated,
            actual=task.cost_actual,
            held=task.spend_hold,
            over_estimate=task.over_estimate,
        ),
        tier=task.tier,
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
    """A task as the API and the client see it, ready for ``json.dumps``."""
    body = task_out(task).model_dump(mode="json", by_alias=True)
    body.update(extra)
    return body


def task_from_json(data: Mapping[str, Any]) -> Task:
    error = data.get("error")
    cost = data.get("cost") or {}
    return Task(
        id=data["id"],
        kind=data["kind"],
        status=Status(data["status"]),
        lane=Lane(data["lane"]),
        tenant=data["tenant"],
        input=data.get("input"),
        result=data.get("result"),
        error=error_from_json(error) if isinstance(error, dict) else None,
        attempts=int(data.get("attempts", 0)),
        max_attempts=int(data.get("max_attempts", 0)),
        request_key=data.get("idempotency_key"),
        duplicate_of=data.get("duplicate_of"),
        upstream_ref=data.get("upstream_ref"),
        upstream_request_id=data.get("upstream_request_id"),
        cost_estimated=float(cost.get("estimated") or 0.0),
        cost_actual=cost.get("actual"),
        spend_hold=float(cost.get("held") or 0.0),
        over_estimate=float(cost.get("over_estimate") or 0.0),
        tier=data.get("tier"),
        created_at=epoch(data.get("created_at")) or 0.0,
        updated_at=epoch(data.get("updated_at")) or 0.0,
        started_at=epoch(data.get("started_at")),
        finished_at=epoch(data.get("finished_at")),
        deadline_at=epoch(data.get("deadline_at")),
        next_attempt_at=epoch(data.get("next_attempt_at")),
        metadata=dict(data.get("metadata") or {}),
    )


def error_from_json(data: Mapping[str, Any]) -> ErrorInfo:
    try:
        cls = ErrorClass(data.get("class", ""))
    except ValueError:
        cls = ErrorClass.FATAL  # a class this client does not know yet
    return ErrorInfo(cls, str(data.get("type", "")), str(data.get("message", "")))


def epoch(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def submit_body(request: SubmitRequest) -> dict[str, Any]:
    """The ``POST /v1/tasks`` body of a request (its key travels as a header)."""
    r = request
    body: dict[str, Any] = {"kind": r.kind, "input": r.input, "lane": str(r.lane)}
    optional = {
        "max_attempts": r.max_attempts,
        "deadline_s": r.deadline_s,
        "callback_url": r.callback_url,
        "metadata": r.metadata,
        "tier": r.tier,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body
