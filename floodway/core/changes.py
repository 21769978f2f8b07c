"""Every state change of a task the engine writes, by name, and why each sets the flags it sets.

A :class:`~floodway.core.outcome.Completion` is one compare-and-set with flags whose meaning is
subtle (an attempt kept open, an attempt that ends without its worker, an attempt that was not
spent). The retry policy, the worker, the upstream poller, the sweeper and the ledger's rules
build them only here, so the hardest flags read in one file.
"""

from __future__ import annotations

from floodway.core.outcome import Completion
from floodway.core.states import Status
from floodway.core.task import JSON, ErrorClass, ErrorInfo, Task

DEADLINE_PASSED = ErrorInfo(ErrorClass.TIMEOUT, "deadline", "the task's deadline passed")


def _from_running(
    task: Task,
    to: Status,
    *,
    result: JSON = None,
    error: ErrorInfo | None = None,
    next_attempt_at: float | None = None,
    refund_attempt: bool = False,
    invalid_output: bool = False,
    cost_actual: float | None = None,
    keep_attempt: bool = False,
    orphan_until: float | None = None,
) -> Completion:
    """The compare-and-set that moves a running ``task``, held by its lease, to ``to``."""
    return Completion(
        task.id,
        to,
        Status.RUNNING,
        task.lease_token,
        result=result,
        error=error,
        next_attempt_at=next_attempt_at,
        refund_attempt=refund_attempt,
        invalid_output=invalid_output,
        cost_actual=cost_actual,
        keep_attempt=keep_attempt,
        orphan_until=orphan_until,
    )


def succeeded(task: Task, result: JSON, *, cost_actual: float | None = None) -> Completion:
    return _from_running(task, Status.SUCCEEDED, result=result, cost_actual=cost_actual)


def cancelled(task: Task, reason: str) -> Completion:
    error = ErrorInfo(ErrorClass.CANCELLED, "cancelled", reason)
    return _from_running(task, Status.CANCELLED, error=error)


def failed(
    task: Task, error: ErrorInfo, *, invalid_output: bool = False, cost_actual: float | None = None
) -> Completion:
    """A failure no retry can help (fatal, poison): the call is over."""
    return _from_running(
        task, Status.FAILED, error=error, invalid_output=invalid_output, cost_actual=cost_actual
    )


def dead(
    task: Task, error: ErrorInfo, *, invalid_output: bool = False, cost_actual: float | None = None
) -> Completion:
    """Out of attempts: a dead letter (alerted, and its fallback submitted, by the runtime)."""
    return _from_running(
        task, Status.DEAD, error=error, invalid_output=invalid_output, cost_actual=cost_actual
    )


def timed_out(task: Task, error: ErrorInfo, *, cost_actual: float | None = None) -> Completion:
    """The attempt ended and no next one may start in time."""
    return _from_running(task, Status.TIMEOUT, error=error, cost_actual=cost_actual)


def retrying(
    task: Task,
    error: ErrorInfo,
    at: float,
    *,
    free: bool = False,
    invalid_output: bool = False,
    cost_actual: float | None = None,
) -> Completion:
    """Back to the queue until ``at``. ``free``: not the task's failure (a throttle, the same
    work in progress at the provider), so the attempt is given back."""
    return _from_running(
        task,
        Status.RETRYING,
        error=error,
        next_attempt_at=at,
        refund_attempt=free,
        invalid_output=invalid_output,
        cost_actual=cost_actual,
    )


def handed_back(task: Task, now: float, error: ErrorInfo | None = None) -> Completion:
    """Back to the queue at once without spending an attempt: never sent (the worker is
    stopping), or resumable elsewhere (an upstream job to poll again after a crash)."""
    return _from_running(
        task, Status.RETRYING, error=error, next_attempt_at=now, refund_attempt=True
    )


def orphaned(task: Task, to: Status, error: ErrorInfo, until: float | None) -> Completion:
    """The task ends while its call may still run at the provider with nobody to see it end
    (its worker died, or floodway gave up on an upstream job the provider did not stop): the
    attempt stays open until ``until``, when the call could have ended, so its slot stays taken
    and nobody starts the same work before (a last look-up may still find its late success).
    ``until`` None: the provider said it stopped the call, and the attempt ends now."""
    return _from_running(task, to, error=error, orphan_until=until)


def ended_for_waiters(task: Task, to: Status, error: ErrorInfo) -> Completion:
    """The task ends (cancelled, past its deadline) while its worker's call goes on: the
    attempt stays open under the worker's lease, which closes it with the call's outcome, a
    late success going to whoever waits for the same work."""
    return _from_running(task, to, error=error, keep_attempt=True)


def past_deadline(task: Task, now: float, longest_call_s: float) -> Completion:
    """The sweeper's write for a task whose deadline passed, in whatever state it waits."""
    if task.status is Status.RUNNING and not task.parked:
        return ended_for_waiters(task, Status.TIMEOUT, DEADLINE_PASSED)
    if task.parked:
        # No lease (the CAS checks parked); the upstream job may go on (nobody asked it to
        # stop): its slot stays taken as long as a call of the kind may run.
        return Completion(
            task.id,
            Status.TIMEOUT,
            task.status,
            task.lease_token,
            error=DEADLINE_PASSED,
            parked=True,
            orphan_until=now + longest_call_s,
        )
    return Completion(task.id, Status.TIMEOUT, task.status, None, error=DEADLINE_PASSED)
