"""The hang-up rule: what floodway does on every path where it stops waiting for a call it
sent, while the provider may go on running (and billing) it.

An attempt begins when floodway sends a request and ends when the provider's side of it has
ended, not when floodway stops listening. A provider bills what it computed whether or not
the client is still connected, so each path (a timeout, a task cancelled, a batch cancelled,
a deadline, a graceful shutdown, a worker's death) asks :func:`on_hang_up` what to do, from
what the kind declares about its provider:

- a cancel or a deadline ends the task now, and floodway reads the call to its end: its
  result and its bill are recorded, its slot freed when the provider is done;
- a timeout, a shutdown past its grace, or a death cannot read on: the attempt stays open,
  its provider slot taken and its estimate held against the budget, until the call could
  have ended (:func:`call_bound_s`; a call that outlived its timeout is taken to run one more,
  whether floodway hung up on it or died waiting: :func:`unseen_call_s`); an attempt nobody
  saw end is recorded as possibly billed at its estimate;
- the same work is sent again only where that cannot pay twice: under the same key to a
  provider that honours it; a look-up is asked first where the provider has one; to a
  provider with neither, never while the call may run (a timeout ends the task ``timeout``,
  its billing unknown), unless the kind opts in with ``retry_timeouts``.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


class Provider(enum.Enum):
    """What a kind declares about a call its provider runs after floodway has hung up."""

    #: a second call with the same Idempotency-Key joins or replays the first
    KEYED = "keyed"
    #: finished work can be found by its key
    LOOKUP = "lookup"
    #: neither: only the call's own answer says whether it was billed
    NEITHER = "neither"

    @classmethod
    def of(cls, idempotent: bool, lookup: bool) -> Provider:
        if idempotent:
            return cls.KEYED
        return cls.LOOKUP if lookup else cls.NEITHER


class Why(enum.Enum):
    """Why floodway stops waiting for a call."""

    TIMEOUT = "timeout"
    CANCEL = "cancel"
    DEADLINE = "deadline"
    SHUTDOWN = "shutdown"
    DIED = "died"


@dataclass(frozen=True)
class Verdict:
    #: keep reading the call to its end (the task's status may end before it)
    read_on: bool
    #: the task may be sent again now (under the same key where the provider honours it)
    resend: bool
    #: the task ends now without a resend, its billing unknown (``timeout`` or ``failed``)
    ends: bool


def on_hang_up(why: Why, provider: Provider, retry_timeouts: bool = False) -> Verdict:
    """The one decision. A call that is read on needs nothing more; one that is not keeps its
    attempt open until it could have ended, whatever the verdict on the task."""
    if why in (Why.CANCEL, Why.DEADLINE):
        return Verdict(read_on=True, resend=False, ends=True)
    if provider is Provider.KEYED:
        return Verdict(read_on=False, resend=True, ends=False)
    if why is Why.TIMEOUT and retry_timeouts:
        # opted in: the kind accepts paying again, but not a second call beside the first
        return Verdict(read_on=False, resend=True, ends=False)
    return Verdict(read_on=False, resend=False, ends=True)


def held_until(why: Why, now: float, bound_at: float, timeout_s: float) -> float:
    """Until when a call floodway stopped waiting for may still run at the provider: the
    bound its attempt was marked with when it started (``bound_at``), unless the call is
    known to have outlived it: a call that timed out, or one still running at a shutdown
    past that bound, is taken to run at most one more ``timeout_s``."""
    if why is Why.DIED or (why is not Why.TIMEOUT and bound_at > now):
        return bound_at
    return now + timeout_s


#: recent calls a bound is taken from, at least: fewer say too little about the tail
MIN_SAMPLES = 10
#: the quantile of recent call durations a bound starts from
QUANTILE = 0.99
#: a bound is the quantile times this, plus ``SLACK_S``
MARGIN = 2.0
SLACK_S = 0.5


def unseen_call_s(timeout_s: float) -> float:
    """How long a call nobody saw end may run at the provider, at the longest: its timeout,
    and one more. The provider does not stop at floodway's timeout: a call floodway hung up on
    there is taken to run one more (:func:`held_until`), and so is one whose worker died
    before it could hang up."""
    return 2 * timeout_s


def call_bound_s(ordered: Sequence[float], timeout_s: float) -> float:
    """How long a call of a kind may run at the provider, at the longest, as floodway assumes
    when it cannot see the call end: from what the kind's recent calls took (``ordered``,
    shortest first: a high quantile, doubled, plus half a second; a call that timed out counts
    as :func:`unseen_call_s`), never above :func:`unseen_call_s`, which holds until enough
    calls have been seen."""
    longest = unseen_call_s(timeout_s)
    if len(ordered) < MIN_SAMPLES:
        return longest
    rank = max(0, math.ceil(QUANTILE * len(ordered)) - 1)
    return min(longest, ordered[rank] * MARGIN + SLACK_S)


class CallTimes:
    """How long each kind's recent calls took (in process memory): the calls that answered,
    whatever they answered, and the calls floodway timed out on, at the length it takes them
    to run (:func:`unseen_call_s`). A bound drawn from them is written on each attempt as it
    starts, so a process started after a crash reads it from the ledger. Kept in arrival
    order (which to forget) and in length order (the quantile, read on every claim)."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._kept: dict[str, deque[float]] = {}
        self._ordered: dict[str, list[float]] = {}

    def record(self, kind: str, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        kept = self._kept.setdefault(kind, deque())
        ordered = self._ordered.setdefault(kind, [])
        if len(kept) == self._size:
            del ordered[bisect.bisect_left(ordered, kept.popleft())]
        kept.append(seconds)
        bisect.insort(ordered, seconds)

    def bound_s(self, kind: str, timeout_s: float) -> float:
        return call_bound_s(self._ordered.get(kind, ()), timeout_s)
