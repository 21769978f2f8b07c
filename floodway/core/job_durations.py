"""How long a kind's upstream jobs take, learned from its recent ones (in process memory).

When a kind's ``poll_after`` is not set, polling a job before the shortest jobs of its kind
could be done only spends polls. :class:`JobDurations` keeps the durations of the kind's recent
jobs (submit to the poll that found them finished, an upper bound by at most the poll
schedule's lag) and says how long a new job is worth leaving alone: a low quantile of them.
Until a job of the kind has finished, it knows nothing and the schedule's default applies.

"Recent" is by when the job *started*: the jobs of a batch finish shortest first, so keeping
the last ones to finish would keep the longest and push every first poll late.
"""

from __future__ import annotations

import heapq
import math


class JobDurations:
    def __init__(self, size: int = 256, quantile: float = 0.05) -> None:
        self._size = size
        self._kept: list[tuple[float, float]] = []  # a heap of (started at, duration)
        self._quantile = quantile

    def record(self, started_at: float, finished_at: float) -> None:
        """A job of this kind that started at ``started_at`` was seen finished at
        ``finished_at``; past ``size`` jobs, the one that started first is forgotten."""
        seconds = finished_at - started_at
        if math.isfinite(seconds) and seconds > 0:
            heapq.heappush(self._kept, (started_at, seconds))
            if len(self._kept) > self._size:
                heapq.heappop(self._kept)

    def leave_alone_s(self) -> float | None:
        """How long a job is worth leaving unpolled: the low quantile of recent durations
        (nearest rank), or None before any finished."""
        if not self._kept:
            return None
        ordered = sorted(seconds for _started, seconds in self._kept)
        return ordered[max(0, math.ceil(self._quantile * len(ordered)) - 1)]
