"""floodway's exceptions. One root, so callers can catch everything floodway raises.

::

    FloodwayError
    ├── ConfigError              bad configuration (names the key and the file)
    ├── Unavailable              a service floodway depends on cannot be reached: try again
    │   ├── StoreError           the ledger's database cannot be opened or used
    │   └── LimiterUnavailable   the shared limiter (Redis) cannot be reached
    ├── IllegalTransition        a status change that the states table forbids
    │   └── AttemptStillOpen     a retry while the task's last call may still be running
    ├── TaskNotFound             no such task (or not the caller's tenant)
    ├── JobNotFound              no such job (or not the caller's tenant)
    ├── UnknownKind              a kind nobody declared
    ├── InvalidInput             input that is not a JSON object, too deep, ...
    │   └── InvalidJob           a job definition floodway cannot run (has ``step``)
    ├── IdempotencyConflict      an Idempotency-Key reused with a different body
    ├── AdmissionRefused         a tenant limit says "too fast" (has ``limit``, ``retry_after``)
    ├── BudgetExceeded           the submission would pass the tenant's budget this period
    ├── WaitTimeout              ``wait()`` gave up before the task ended
    └── HandlerError             raised by handlers to tell floodway what happened
        ├── RetryableError       worth another attempt (``retry_after``, ``throttled``)
        ├── FatalError           never retried (invalid request, quota exhausted, refusal)
        └── InvalidOutput        the upstream answered, but the output is unusable (poison)
"""

from __future__ import annotations

import difflib
from datetime import UTC, datetime


class FloodwayError(Exception):
    """Root of every exception floodway raises."""


class ConfigError(FloodwayError):
    pass


class Unavailable(FloodwayError):
    """A service floodway depends on cannot be reached now. Nothing was changed by the call
    that raised it; the same call later may succeed (an HTTP API answers 503 + Retry-After)."""

    #: what is down, for messages: "the task ledger", "the shared limiter (Redis)"
    what = "a service floodway depends on"


class StoreError(Unavailable):
    what = "the task ledger"


class LimiterUnavailable(Unavailable):
    """The shared limiter state cannot be reached (Redis down, timed out, failing over).

    The dispatcher fails closed on it: it admits nothing until the backend answers again, so a
    limit is never exceeded because its state was out of reach."""

    what = "the shared limiter (Redis)"


class IllegalTransition(FloodwayError):
    def __init__(self, frm: str, to: str, detail: str = "") -> None:
        self.frm, self.to = frm, to
        # what a person asked for says it in their words; the bare transition is for code
        super().__init__(detail or f"illegal transition {frm} -> {to}")


class AttemptStillOpen(IllegalTransition):
    """A manual retry of a task whose last call may still be running at the provider (its
    worker died mid-call): starting the work again could pay for it twice. ``until`` is when
    that call will have ended at the latest (the kind's timeout after it started)."""

    def __init__(self, task_id: str, frm: str, until: float, now: float) -> None:
        self.task_id, self.until = task_id, until
        self.retry_after = max(0.0, until - now)
        super().__init__(
            frm,
            "queued",
            f"task {task_id}'s last call may still be running at the provider (its worker "
            f"died mid-call); retry it in {self.retry_after:.0f}s, when that call has ended",
        )


class TaskNotFound(FloodwayError):
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"no task {task_id!r}")


class JobNotFound(FloodwayError):
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job {job_id!r}")


class UnknownKind(FloodwayError):
    def __init__(self, kind: str, known: list[str] | None = None) -> None:
        self.kind, self.known = kind, sorted(known or [])
        if not self.known:
            hint = (
                " (no kinds are configured here: declare [kinds.NAME] in the file given with "
                "--config, or @fw.kind(...) in Python)"
            )
        else:
            near = difflib.get_close_matches(kind, self.known, n=1)
            mean = f"did you mean {near[0]!r}? " if near else ""
            hint = f" ({mean}known kinds: {', '.join(self.known)})"
        super().__init__(f"unknown kind {kind!r}{hint}")


class InvalidInput(FloodwayError):
    pass


class InvalidJob(InvalidInput):
    """A job definition floodway cannot run; ``step`` names the step at fault (None: the
    job as a whole)."""

    def __init__(self, step: str | None, message: str) -> None:
        self.step, self.reason = step, message
        super().__init__(f"step {step!r}: {message}" if step is not None else message)


class IdempotencyConflict(FloodwayError):
    def __init__(self, key: str, task_id: str) -> None:
        self.key, self.task_id = key, task_id
        super().__init__(
            f"Idempotency-Key {key!r} was already used for task {task_id} with a different body"
        )


class AdmissionRefused(FloodwayError):
    def __init__(self, limit: str, message: str, retry_after: float) -> None:
        self.limit, self.retry_after = limit, retry_after
        super().__init__(message)


class BudgetExceeded(FloodwayError):
    """A submission whose estimated cost would pass the tenant's budget for this period."""

    def __init__(
        self, tenant: str, amount: float, left: float, needed: float, resets_at: float, now: float
    ) -> None:
        self.tenant, self.amount, self.left = tenant, amount, left
        self.needed, self.resets_at = needed, resets_at
        self.retry_after = max(0.0, resets_at - now)
        try:
            resets = datetime.fromtimestamp(resets_at, UTC).isoformat()
        except (OverflowError, OSError, ValueError):
            resets = "never"
        super().__init__(
            f"tenant {tenant!r} has {left:.6g} left of its budget of {amount:.6g} this period; "
            f"this submission is estimated at {needed:.6g}; the budget resets at {resets} (it is "
            f"set by [tenants.{tenant}] budget, or [tenants] budget for every tenant, in the "
            "server's configuration)"
        )


class WaitTimeout(FloodwayError):
    pass


class HandlerError(FloodwayError):
    """Base of the exceptions a handler raises to classify its own failure."""

    error_type: str = "handler_error"

    def __init__(self, message: str, *, type: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: the provider's HTTP status, when the failure was an HTTP answer (metrics count 5xx)
        self.status = status
        if type is not None:
            self.error_type = type


class RetryableError(HandlerError):
    error_type = "retryable"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        throttled: bool = False,
        in_progress: bool = False,
        type: str | None = None,
        status: int | None = None,
    ) -> None:
        default = "rate_limited" if throttled else "in_progress" if in_progress else None
        super().__init__(message, type=type or default, status=status)
        self.retry_after = retry_after
        # A throttle (429) is the resource's problem, not the task's: it does not use an attempt.
        self.throttled = throttled
        # "The same work (key) is in progress" (a 409 from a provider that honours
        # Idempotency-Key): asking again later replays it; not the task's failure either.
        self.in_progress = in_progress


class FatalError(HandlerError):
    error_type = "fatal"


class InvalidOutput(HandlerError):
    error_type = "invalid_output"
