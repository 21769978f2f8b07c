"""The one retry policy: classify what happened, then decide what to write.

Full-jitter exponential backoff (delay = uniform(0, min(cap, base * 2**(attempt-1)))), a
server's Retry-After wins, fatal errors never retry, a throttle (429) does not use an attempt,
invalid output three times is poison, attempts exhausted is dead, a deadline passed is timeout,
any other exception is ``unexpected`` and retried.
Every call site (worker, poller, webhook delivery, client) uses this module.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import httpx

from floodway.core import changes
from floodway.core.backoff import Backoff
from floodway.core.errors import FatalError, HandlerError, InvalidOutput, RetryableError
from floodway.core.outcome import Cancelled, Completion, Failed, Outcome, Succeeded
from floodway.core.task import ErrorClass, ErrorInfo, Task

#: the error type of an exception that is none of floodway's (nor a timeout or connection
#: error): logged with its traceback, and retried
UNEXPECTED = "unexpected"


@dataclass(frozen=True)
class RetryPolicy:
    #: first retry within 0.5 s, as the OpenAI and Anthropic SDKs begin: most 5xx are one
    #: call's bad luck; a provider that keeps failing gets the doubling gaps, up to a minute
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=0.5, cap_s=60.0))
    poison_after: int = 3  # invalid outputs before the input is marked poison
    #: how long a throttled task waits at least when the server gave no Retry-After
    throttle_floor_s: float = 0.5

    def classify(self, exc: BaseException) -> Failed:
        """Map a handler's exception to a failure class."""
        if isinstance(exc, RetryableError):
            return Failed(
                ErrorInfo(ErrorClass.RETRYABLE, exc.error_type, exc.message),
                retry_after=exc.retry_after,
                throttled=exc.throttled,
                in_progress=exc.in_progress,
                upstream_status=exc.status,
                # an adapter's own timeout: the call may go on at the provider
                hung_up=exc.error_type == "timeout",
            )
        if isinstance(exc, InvalidOutput):
            return Failed(
                ErrorInfo(ErrorClass.POISON, exc.error_type, exc.message),
                upstream_status=exc.status,
            )
        if isinstance(exc, FatalError | HandlerError):
            return Failed(
                ErrorInfo(ErrorClass.FATAL, exc.error_type, exc.message), upstream_status=exc.status
            )
        if isinstance(exc, TimeoutError | asyncio.TimeoutError | httpx.TimeoutException):
            error = ErrorInfo(ErrorClass.RETRYABLE, "timeout", _describe(exc))
            return Failed(error, hung_up=True)
        if isinstance(exc, ConnectionError | httpx.TransportError):
            return Failed(ErrorInfo(ErrorClass.RETRYABLE, "connection", _describe(exc)))
        # Any other exception is a bug or a failure nobody foresaw: retried, as most queues do
        # (a flaky dependency raises whatever it raises), within max_attempts, then dead.
        return Failed(ErrorInfo(ErrorClass.RETRYABLE, UNEXPECTED, _describe(exc)))

    def decide(
        self, task: Task, outcome: Outcome, now: float, rng: random.Random | None = None
    ) -> Completion:
        """What to write for a running ``task`` (claimed, so ``task.attempts`` counts this
        attempt) given what the attempt produced."""
        if isinstance(outcome, Succeeded):
            return changes.succeeded(task, outcome.result, cost_actual=outcome.usage)
        if isinstance(outcome, Cancelled):
            return changes.cancelled(task, outcome.reason)
        if not isinstance(outcome, Failed):
            raise TypeError(f"decide() cannot write {outcome!r}")
        error, cost = outcome.error, outcome.usage
        if error.cls is ErrorClass.POISON:
            if task.invalid_outputs + 1 >= self.poison_after:
                poison = ErrorInfo(
                    ErrorClass.POISON,
                    error.type,
                    f"invalid output on {task.invalid_outputs + 1} attempts: {error.message}",
                )
                return changes.failed(task, poison, invalid_output=True, cost_actual=cost)
            retry = ErrorInfo(ErrorClass.RETRYABLE, error.type, error.message)
            return self._retry(task, retry, None, False, now, rng, invalid=True, cost=cost)
        if error.cls is ErrorClass.RETRYABLE:
            return self._retry(
                task,
                error,
                outcome.retry_after,
                outcome.throttled or outcome.in_progress,
                now,
                rng,
                cost=cost,
            )
        if error.cls is ErrorClass.TIMEOUT:
            return changes.timed_out(task, error, cost_actual=cost)
        return changes.failed(task, error, cost_actual=cost)

    def _retry(
        self,
        task: Task,
        error: ErrorInfo,
        retry_after: float | None,
        free: bool,
        now: float,
        rng: random.Random | None,
        *,
        invalid: bool = False,
        cost: float | None = None,
    ) -> Completion:
        """``free``: not the task's failure (a throttle, the same work in progress): no attempt
        is spent, at least ``throttle_floor_s`` is waited."""
        if not free and task.attempts >= task.max_attempts:
            dead = ErrorInfo(
                ErrorClass.EXHAUSTED,
                error.type,
                f"gave up after {task.attempts} attempts: {error.message}",
            )
            return changes.dead(task, dead, invalid_output=invalid, cost_actual=cost)
        if retry_after is not None:
            delay = max(0.0, retry_after)
        elif free:
            delay = max(self.throttle_floor_s, self.backoff.delay(task.attempts, rng))
        else:
            delay = self.backoff.delay(task.attempts, rng)
        at = now + delay
        if task.deadline_at is not None and at >= task.deadline_at:
            late = ErrorInfo(
                ErrorClass.TIMEOUT,
                "deadline",
                f"the next attempt ({delay:.1f}s away) would start after the deadline; "
                f"last error: {error.message}",
            )
            return changes.timed_out(task, late, cost_actual=cost)
        return changes.retrying(
            task, error, at, free=free, invalid_output=invalid, cost_actual=cost
        )


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
