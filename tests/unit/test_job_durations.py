"""The poll schedule of a kind with no ``poll_after``: it learns how long its jobs take."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from floodway.core.job_durations import JobDurations
from floodway.core.upstream import PollSchedule


def test_nothing_known_the_default_first_poll_then_the_cold_gaps_apply() -> None:
    schedule = PollSchedule(first_s=1.0, durations=JobDurations())
    assert schedule.first_delay() == 1.0
    assert 0.45 < schedule.next_delay(1.0, 1, random.Random(1)) <= 0.65  # cold: 0.65 x the age
    assert schedule.observe(0.0, 2.0)  # the first finished: the parked ones are due sooner
    assert not schedule.observe(0.0, 2.1)
    assert schedule.next_delay(3.0, 1, random.Random(1)) <= 0.13 * 3


def test_the_first_poll_follows_a_low_quantile_of_recent_jobs() -> None:
    durations = JobDurations(quantile=0.1)
    schedule = PollSchedule(first_s=1.0, durations=durations)
    for i in range(100):  # a batch: every job started at 0, finishing shortest first
        schedule.observe(0.0, 2.0 + i * 0.02)
    assert schedule.first_delay() == pytest.approx(2.18)
    # A job polled early (it was parked before any finished) waits for that age too.
    assert schedule.next_delay(1.0, 1, random.Random(1)) == pytest.approx(1.18)
    assert schedule.next_delay(3.0, 3, random.Random(1)) < 0.4  # past it: the age-based gap


def test_the_jobs_kept_are_the_last_to_start_not_the_last_to_finish() -> None:
    durations = JobDurations(size=10, quantile=0.0)
    for i in range(10):  # an old batch of long jobs
        durations.record(float(i), float(i) + 30.0)
    for i in range(10):  # a newer batch: its short jobs finish first, the long ones later
        durations.record(100.0 + i, 100.0 + i + 2.0 + i)
    assert durations.leave_alone_s() == 2.0
    durations.record(5.0, 5.0 - 1.0)  # nonsense (finished before it started): ignored
    assert durations.leave_alone_s() == 2.0


def test_a_set_poll_after_learns_nothing() -> None:
    schedule = PollSchedule(first_s=2.0)
    schedule.observe(0.0, 0.5)
    assert schedule.first_delay() == 2.0


def first_batch(seed: int, jobs: int = 100) -> tuple[float, float]:
    """A kind's first batch on a fake clock: ``jobs`` jobs of 2-4 s submitted at 0 and polled
    on the schedule, the first one seen finished hastening the rest (as the poller does).
    (mean polls per job, p95 detection lag as a share of the job's duration)"""
    rng = random.Random(seed)
    schedule = PollSchedule(first_s=1.0, durations=JobDurations())
    ends = [rng.uniform(2.0, 4.0) for _ in range(jobs)]
    due = [(schedule.first_delay(), j) for j in range(jobs)]
    polls = [0] * jobs
    lags: list[float] = []
    while due:
        due.sort()
        now, j = due.pop(0)
        polls[j] += 1
        if now < ends[j]:
            due.append((now + schedule.next_delay(now, polls[j], rng), j))
            continue
        lags.append((now - ends[j]) / ends[j])
        if schedule.observe(0.0, now):  # every job started at 0: all as old, all due now
            due = [(min(at, now), k) for at, k in due]
    lags.sort()
    return sum(polls) / jobs, lags[math.ceil(0.95 * jobs) - 1]


def test_a_first_batch_learns_from_its_first_jobs_to_end() -> None:
    runs = [first_batch(seed) for seed in range(10)]
    assert statistics.median(polls for polls, _lag in runs) <= 6
    assert all(lag_p95 <= 0.15 for _polls, lag_p95 in runs)
