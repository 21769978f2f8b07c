"""The poll schedule of a kind with no ``poll_after``: it learns how long its jobs take."""

from __future__ import annotations

import random

import pytest

from floodway.core.job_durations import JobDurations
from floodway.core.upstream import PollSchedule


def test_nothing_known_the_default_first_poll_applies() -> None:
    schedule = PollSchedule(first_s=1.0, durations=JobDurations())
    assert schedule.first_delay() == 1.0
    assert schedule.next_delay(1.0, 1, random.Random(1)) < 0.2


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
