"""floodway's errors as problem documents (RFC 9457), one table for both sides of the wire.

The server renders a :class:`~floodway.core.errors.FloodwayError` with :func:`render`; the
client turns the document back into the same class with :func:`error_from`. A problem's
``type`` is ``urn:floodway:problem:<slug>``: a stable name a program can switch on. Statuses
without a domain error (routing, methods, body limits) have slugs of their own
(:data:`HTTP_SLUGS`); a client raises its generic API error for those.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from floodway.core.errors import (
    AdmissionRefused,
    AttemptStillOpen,
    BudgetExceeded,
    FloodwayError,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    InvalidJob,
    JobNotFound,
    LimiterUnavailable,
    StoreError,
    TaskNotFound,
    Unavailable,
    UnknownKind,
)
from floodway.wire.tasks import timestamp

TYPE_PREFIX = "urn:floodway:problem:"

#: slugs for plain HTTP statuses (routing, methods, framework-raised errors)
HTTP_SLUGS = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    406: "not-acceptable",
    409: "conflict",
    413: "body-too-large",
    415: "unsupported-media-type",
    422: "validation-error",
    429: "too-many-requests",
    500: "internal-error",
    503: "unavailable",
}

Members = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    """What the server answers for an error: status, slug, detail, members and headers."""

    status: int
    slug: str
    detail: str
    members: Members
    headers: dict[str, str]
    title: str | None = None


@dataclass(frozen=True)
class ProblemType:
    """One error class on the wire: how the server writes it and how the client reads it."""

    slug: str
    status: int
    error: type[FloodwayError]
    #: the extension members that carry the error's fields
    members: Callable[[Any], Members]
    #: the error, from a problem document and the seconds to wait it names (or 1)
    read: Callable[[Mapping[str, Any], float, float], FloodwayError]
    #: the error's wait, for ``Retry-After``; None: the answer has no Retry-After
    wait: Callable[[Any], float] | None = None
    detail: Callable[[Any], str] = str
    title: str | None = None


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` is whole seconds (RFC 9110); round up so a client never comes early."""
    return str(max(1, math.ceil(seconds)))


def _text(problem: Mapping[str, Any], name: str) -> str:
    return str(problem.get(name, ""))


def _number(problem: Mapping[str, Any], name: str) -> float:
    value = problem.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _resets_at(exc: BudgetExceeded) -> str:
    at = timestamp(exc.resets_at)
    return at.isoformat() if at is not None else "never"


def _read_budget(problem: Mapping[str, Any], wait: float, now: float) -> BudgetExceeded:
    try:
        resets_at = datetime.fromisoformat(_text(problem, "resets_at")).timestamp()
    except ValueError:
        resets_at = now + wait
    return BudgetExceeded(
        _text(problem, "tenant"),
        _number(problem, "budget"),
        _number(problem, "left"),
        _number(problem, "estimated"),
        resets_at,
        resets_at - wait,
    )


def _outage(cls: type[Unavailable], slug: str) -> ProblemType:
    return ProblemType(
        slug,
        503,
        cls,
        members=lambda exc: {},
        read=lambda problem, wait, now: cls(_text(problem, "detail")),
        wait=lambda exc: 1.0,
        detail=lambda exc: f"{exc.what} is unavailable; try again shortly",
    )


#: most specific class first: a subclass's row comes before its base's
TABLE: tuple[ProblemType, ...] = (
    ProblemType(
        "task-not-found",
        404,
        TaskNotFound,
        members=lambda exc: {"task_id": exc.task_id},
        read=lambda problem, wait, now: TaskNotFound(_text(problem, "task_id")),
    ),
    ProblemType(
        "unknown-kind",
        422,
        UnknownKind,
        members=lambda exc: {"kind": exc.kind, "known_kinds": exc.known},
        read=lambda problem, wait, now: UnknownKind(
            _text(problem, "kind"), [str(k) for k in problem.get("known_kinds") or []]
        ),
    ),
    ProblemType(
        "job-not-found",
        404,
        JobNotFound,
        members=lambda exc: {"job_id": exc.job_id},
        read=lambda problem, wait, now: JobNotFound(_text(problem, "job_id")),
    ),
    ProblemType(  # a job's definition: the step at fault named (null: the job as a whole)
        "invalid-job",
        422,
        InvalidJob,
        members=lambda exc: {"step": exc.step, "reason": exc.reason},
        read=lambda problem, wait, now: InvalidJob(problem.get("step"), _text(problem, "reason")),
    ),
    ProblemType(
        "invalid-input",
        422,
        InvalidInput,
        members=lambda exc: {},
        read=lambda problem, wait, now: InvalidInput(_text(problem, "detail")),
    ),
    ProblemType(
        "idempotency-conflict",
        409,
        IdempotencyConflict,
        members=lambda exc: {"key": exc.key, "task_id": exc.task_id},
        read=lambda problem, wait, now: IdempotencyConflict(
            _text(problem, "key"), _text(problem, "task_id")
        ),
    ),
    ProblemType(  # ask again once the call surely ended
        "attempt-still-open",
        409,
        AttemptStillOpen,
        members=lambda exc: {
            "task_id": exc.task_id,
            "from_status": str(exc.frm),
            "retry_after": exc.retry_after,
        },
        read=lambda problem, wait, now: AttemptStillOpen(
            _text(problem, "task_id"), _text(problem, "from_status"), now + wait, now
        ),
        wait=lambda exc: exc.retry_after,
    ),
    ProblemType(
        "illegal-transition",
        409,
        IllegalTransition,
        members=lambda exc: {"from_status": str(exc.frm), "to_status": str(exc.to)},
        read=lambda problem, wait, now: IllegalTransition(
            _text(problem, "from_status"), _text(problem, "to_status"), _text(problem, "detail")
        ),
    ),
    ProblemType(  # money, not speed: waiting helps only at the reset
        "budget-exceeded",
        402,
        BudgetExceeded,
        members=lambda exc: {
            "tenant": exc.tenant,
            "budget": exc.amount,
            "left": exc.left,
            "estimated": exc.needed,
            "resets_at": _resets_at(exc),
        },
        read=_read_budget,
        wait=lambda exc: exc.retry_after,
        title="Payment Required",
    ),
    ProblemType(
        "admission-refused",
        429,
        AdmissionRefused,
        members=lambda exc: {"limit": exc.limit, "retry_after": exc.retry_after},
        read=lambda problem, wait, now: AdmissionRefused(
            _text(problem, "limit"), _text(problem, "detail"), wait
        ),
        wait=lambda exc: exc.retry_after,
        title="Too Many Requests",
    ),
    _outage(LimiterUnavailable, "limiter-unavailable"),
    _outage(StoreError, "store-unavailable"),
)

_BY_SLUG = {entry.slug: entry for entry in TABLE}


def problem_type(exc: FloodwayError) -> ProblemType | None:
    """The table's row for ``exc``: its own class's, or its nearest base's."""
    for entry in TABLE:
        if isinstance(exc, entry.error):
            return entry
    if isinstance(exc, Unavailable):  # an outage of something the table does not name
        return _BY_SLUG["store-unavailable"]
    return None


def render(exc: FloodwayError) -> Rendered | None:
    """The problem the server answers for ``exc`` (None: not an error a client may see)."""
    entry = problem_type(exc)
    if entry is None:
        return None
    headers = {"Retry-After": retry_after_header(entry.wait(exc))} if entry.wait else {}
    return Rendered(
        entry.status, entry.slug, entry.detail(exc), entry.members(exc), headers, entry.title
    )


def slug_of(problem: Mapping[str, Any]) -> str:
    return str(problem.get("type", "")).removeprefix(TYPE_PREFIX)


def error_from(
    problem: Mapping[str, Any], status: int, retry_after: str | None, now: float
) -> FloodwayError | None:
    """The floodway error a problem document describes, as the library would have raised it
    (None: a problem with no domain class, such as a routing error). ``retry_after`` is the
    answer's ``Retry-After`` header, used when the document names no wait of its own."""
    entry = _BY_SLUG.get(slug_of(problem))
    if entry is None and status == 429:
        entry = _BY_SLUG["admission-refused"]
    if entry is None:
        return None
    wait = problem.get("retry_after")
    if not isinstance(wait, int | float) or isinstance(wait, bool):
        wait = float(retry_after) if retry_after and retry_after.isdigit() else 1.0
    return entry.read(problem, float(wait), now)
