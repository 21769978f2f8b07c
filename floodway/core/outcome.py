"""What running a task produced (the executor's answer), and what to write (the decision).

run -> decide -> persist: the executor returns an :data:`Outcome`, :mod:`floodway.core.retry`
maps it to a :class:`Completion`, and the completer writes it as a compare-and-set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from floodway.core.spend import Charge
from floodway.core.states import Status
from floodway.core.task import JSON, ErrorClass, ErrorInfo

#: an effect of a completion, delivered from the outbox (migration 011)
Effect = Literal["fallback", "alert"]


@dataclass(frozen=True)
class Succeeded:
    result: JSON
    usage: float | None = None  # actual cost the provider reported


@dataclass(frozen=True)
class Failed:
    error: ErrorInfo
    retry_after: float | None = None
    throttled: bool = False
    in_progress: bool = False  # the provider works on the same key already
    usage: float | None = None
    upstream_status: int | None = None  # the provider's HTTP status, if it answered one
    #: floodway stopped waiting (a timeout) while the call may go on at the provider
    hung_up: bool = False


@dataclass(frozen=True)
class Cancelled:
    reason: str = "cancelled by request"


@dataclass(frozen=True)
class Parked:
    """The handler started upstream job ``ref`` and asks to be woken for a poll at ``poll_at``.

    A handler returns it (``return floodway.Parked(job_id, poll_at)``) instead of waiting: the
    task stays ``running`` on a durable timer, without a worker, and the kind's poller (or the
    provider's callback) finishes it. Its provider slot stays held meanwhile."""

    ref: str
    poll_at: float
    #: the provider slot stays taken while it waits (False: a line of a provider batch,
    #: counted by the batch queue's limits, not by the calls in flight)
    holds_slot: bool = True


Outcome = Succeeded | Failed | Cancelled | Parked


@dataclass(frozen=True)
class Completion:
    """One compare-and-set: ``task_id`` in ``expected`` held by ``lease_token`` -> ``to``.

    The task's status and its *attempt* are two things. Usually the write ends both: the call
    is over. But a task can end while its call may still be running at the provider (its
    deadline passed mid-call, or it was cancelled while others wait for the same work); then
    the attempt stays open (``keep_attempt``): it keeps its lease, its provider slot and the
    work, and its worker's last write closes it, handing a late success to whoever waits for
    the work. When the worker died mid-call, nobody can close the attempt, so it stays open
    until the call could have ended (``orphan_until``): nobody starts the same work before."""

    task_id: str
    to: Status
    expected: Status = Status.RUNNING
    lease_token: str | None = None
    result: JSON = None
    error: ErrorInfo | None = None
    next_attempt_at: float | None = None
    refund_attempt: bool = False  # a throttle or a graceful release does not use an attempt
    invalid_output: bool = False
    cost_actual: float | None = None
    #: the task is parked on an upstream job (no lease): the CAS checks ``parked`` instead
    parked: bool = False
    #: the task's call goes on after this write (its worker holds the lease and will close it)
    keep_attempt: bool = False
    #: the task's call may go on without a worker until then (its worker died mid-call)
    orphan_until: float | None = None
    #: what the provider billed for this attempt: written to the spend ledger with the status
    charge: Charge | None = None
    #: floodway stopped waiting for this attempt's call, which may run until then: should the
    #: task have ended meanwhile (a cancel, a deadline), its attempt stays open that long
    hung_up_until: float | None = None
    #: the provider's id of its answer to this attempt's call (None: it gave none, or no
    #: answer came): kept with the task, a later call's replacing it
    upstream_request_id: str | None = None

    @property
    def closes_attempt(self) -> bool:
        return not self.keep_attempt and self.orphan_until is None

    @property
    def effects(self) -> tuple[Effect, ...]:
        """What follows once this write lands, written to the outbox in its transaction: a
        dead task's alert, a poison task's fallback (its kind's, if it has one)."""
        if self.to is Status.DEAD:
            return ("alert",)
        poison = self.error is not None and self.error.cls is ErrorClass.POISON
        return ("fallback",) if self.to is Status.FAILED and poison else ()


@dataclass(frozen=True)
class Applied:
    """What a completion did: ``applied`` is False when the CAS found the task elsewhere."""

    task_id: str
    applied: bool
    status: Status | None = None  # the status now stored (whoever wrote it)
    released: tuple[str, ...] = ()  # waiters resolved or promoted by this completion
    #: the write found the task ended meanwhile, its attempt still open under our lease, and
    #: closed the attempt (a late success was kept for the work; the work went on otherwise)
    closed: bool = False
