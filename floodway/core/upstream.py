"""Upstream jobs: work a provider runs asynchronously (submit, then poll or be called back).

A handler that started such a job returns :class:`~floodway.core.outcome.Parked`; the task then
waits on a durable timer, not in a worker, and is polled on the :class:`PollSchedule` of its kind
until the provider's :class:`JobView` says the job ended.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from floodway.core.backoff import Backoff
from floodway.core.job_durations import JobDurations
from floodway.core.task import JSON

JobState = Literal["done", "failed", "running"]


@dataclass(frozen=True)
class JobView:
    """A provider's description of one job (a poll answer or a callback body)."""

    state: JobState
    result: JSON = None
    message: str = ""  # why it failed
    error_type: str | None = None  # the provider's error type/code, when it failed
    #: failed in a way a resubmission would repeat (a refusal, a bad request): no retry
    fatal: bool = False
    usage: float | None = None


@dataclass(frozen=True)
class PollSchedule:
    """When to poll an upstream job.

    The first poll comes ``first_s`` after the submit: the kind's ``poll_after`` (set it near the
    *shortest* typical job duration), or ``callback_grace`` when the provider calls back and
    polling is only the fallback for lost callbacks. With ``poll_after`` unset, a low quantile of
    the kind's recent job durations (``durations``) plays its part once one job has finished;
    until then the gaps are ``cold_ratio`` x the age, and the first job seen finished makes every
    parked job of the kind at least as old due at once (:meth:`observe` says when), then on
    ``ratio``: the first jobs of a batch to end tell when the rest may, and nothing is spent
    polling densely before any could.
    After that, the gap before the next poll has a ceiling of ``ratio`` x the job's age (capped
    at ``max_gap_s``) and is drawn by the one backoff policy
    (:class:`~floodway.core.backoff.Backoff`, full jitter) over the top
    ``jitter`` share of that ceiling:

    - proportional to age, not to the number of polls: "still running at t" says the job is
      probably of the order of t long. A gap of at most ``ratio`` x t bounds the detection lag by
      ``ratio`` x the job's duration by construction, and the number of polls grows with
      log(duration / first_s), not with the duration.
    - jitter over the top quarter, not over the whole ceiling: it still spreads tasks submitted
      together, while full jitter over [0, ceiling] spends many short gaps that learn nothing.
      Modelled for jobs of uniform 2-4 s, first poll at 2 s (mean polls / p95 lag as a share of
      the duration): full jitter, ratio 0.15: 7.1 / 11.6 %; ratio 0.2: 5.8 / 15.4 %. Top half,
      ratio 0.15: 5.1 / 12 %. Top quarter, ratio 0.13: 5.1 / 11 %, which leaves room under both
      targets (6 polls, 15 %) for the time polling itself takes; bench/upstream.py measures it.
    """

    first_s: float = 1.0
    ratio: float = 0.13
    jitter: float = 0.25
    min_gap_s: float = 0.01
    max_gap_s: float = 60.0
    #: set when ``poll_after`` is not: no poll before a job's age reaches a low quantile of the
    #: kind's recent durations (``first_s`` applies until one finished)
    durations: JobDurations | None = field(default=None, compare=False)
    #: the ratio while ``durations`` knows no finished job yet
    cold_ratio: float = 0.65

    def first_delay(self) -> float:
        """Seconds from the submit to the first poll."""
        learned = None if self.durations is None else self.durations.leave_alone_s()
        return self.first_s if learned is None else learned

    def next_delay(self, age_s: float, polls: int, rng: random.Random | None = None) -> float:
        """Seconds until the next poll of a job ``age_s`` old that was polled ``polls`` times."""
        learned = None if self.durations is None else self.durations.leave_alone_s()
        cold = self.durations is not None and learned is None
        ratio = self.cold_ratio if cold else self.ratio
        ceiling = min(self.max_gap_s, max(self.min_gap_s, ratio * max(0.0, age_s)))
        spread = ceiling * self.jitter
        delay = ceiling - spread + Backoff(base_s=spread, cap_s=spread).delay(max(1, polls), rng)
        return delay if learned is None else max(delay, learned - age_s)

    def observe(self, started_at: float, finished_at: float) -> bool:
        """A job of the kind submitted at ``started_at`` was seen finished at ``finished_at``.
        True when it is the first the schedule learns of: the jobs as old, parked on the cold
        gaps, are due now (:meth:`~floodway.store.base.Store.hasten_parked`)."""
        if self.durations is None:
            return False
        first = self.durations.leave_alone_s() is None
        self.durations.record(started_at, finished_at)
        return first and self.durations.leave_alone_s() is not None


#: the first poll of a kind with no ``poll_after`` whose jobs have not finished yet
DEFAULT_FIRST_POLL_S = 1.0


def first_poll_after(
    poll_after_s: float | None, *, ratio: float = 0.13, max_gap_s: float = 60.0
) -> PollSchedule:
    """The schedule of a kind whose first poll comes ``poll_after_s`` after the submit, or,
    with None, after a low quantile of its recent jobs' durations."""
    return PollSchedule(
        first_s=DEFAULT_FIRST_POLL_S if poll_after_s is None else poll_after_s,
        ratio=ratio,
        max_gap_s=max_gap_s,
        durations=JobDurations() if poll_after_s is None else None,
    )
