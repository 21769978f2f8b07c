"""Limits nobody configured: which limit is in force per dimension, and what a 429 means.

A resource has three dimensions: **concurrency** (calls in flight), **requests** (per second)
and **tokens** (per second). Each dimension's limit in force comes from one of three sources:

* ``configured``: the resource's configuration, at its ``headroom``;
* ``header``: the figure the provider publishes in its rate-limit headers (at ``headroom``),
  for a dimension not configured, or below the configured one (a header never raises one);
* ``learned``: an estimate the fleet keeps in the limiter backend, when ``adaptive = true``:
  set by a 429 that tracks load and probed upward while no 429 comes (AIMD), never above the
  configured or published limit. A resource with no in-flight limit starts in **slow start**
  (a few calls at once, one more per call answered) until a 429 sets the limit.

A 429 is a **limit** when it tracks load, and **noise** otherwise (:func:`judge`). Only a limit
pauses the resource and lowers an estimate; noise costs the refused task its Retry-After alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from floodway.limits.headers import CONCURRENCY, REQUESTS, TOKENS

CONFIGURED = "configured"
HEADER = "header"
LEARNED = "learned"
DIMENSIONS = (CONCURRENCY, REQUESTS, TOKENS)
RATES = (REQUESTS, TOKENS)


def published(dimension: str) -> str:
    """The estimates field holding the provider's published figure for ``dimension``."""
    return f"published:{dimension}"


def cuts(estimates: Mapping[str, float], dimension: str) -> int:
    """How many times a 429 has lowered this dimension's estimate (0: never, slow start)."""
    return int(estimates.get(f"{dimension}:n", 0))


@dataclass(frozen=True)
class Limit:
    value: float  # slots, or units per second
    source: str  # CONFIGURED | HEADER | LEARNED
    ceiling: float = math.inf  # what learning may grow it back to (configured or published)
    guess: bool = False  # slow start: no 429 has bounded it yet, so it is no evidence


def in_force(
    dimension: str,
    configured: float | None,
    estimates: Mapping[str, float],
    *,
    adaptive: bool,
    headroom: float,
    initial_concurrency: int,
) -> Limit | None:
    """The limit of one dimension now, or None when nothing limits it."""
    ceiling: Limit | None = None if configured is None else Limit(configured, CONFIGURED)
    if adaptive:
        figure = estimates.get(published(dimension))
        if figure is not None and figure > 0:
            value = figure * headroom
            if dimension == CONCURRENCY:
                value = max(1.0, math.floor(value + 1e-9))
            if ceiling is None or value < ceiling.value:
                ceiling = Limit(value, HEADER)
    if ceiling is not None:
        ceiling = Limit(ceiling.value, ceiling.source, ceiling.value)
    if not adaptive:
        return ceiling
    learned = estimates.get(dimension)
    if learned is None and dimension == CONCURRENCY and ceiling is None:
        learned = float(initial_concurrency)  # slow start: nothing known of the cap yet
    if learned is not None and (ceiling is None or learned < ceiling.value):
        guess = dimension == CONCURRENCY and not cuts(estimates, dimension)
        return Limit(learned, LEARNED, ceiling.value if ceiling else math.inf, guess)
    return ceiling


@dataclass(frozen=True)
class Throttle:
    """What floodway knew when a 429 came back."""

    limits: Mapping[str, Limit | None]  # per dimension, in force at the time
    in_flight: float | None  # calls in flight when the refused one was sent (itself included)
    sending_rate: float | None  # requests per second sent lately (adaptive resources only)
    adaptive: bool
    concurrency_hint: bool  # the provider said "too many concurrent requests"
    exhausted: frozenset[str]  # dimensions the 429's own headers report spent
    persistent: bool  # 429s are a large share of the resource's recent answers


@dataclass(frozen=True)
class Verdict:
    limit: bool  # False: noise
    dimensions: frozenset[str]  # the dimensions the 429 is about (to lower, if learned)
    why: str

    @property
    def concurrency_only(self) -> bool:
        return self.dimensions == {CONCURRENCY}


#: a load at or above this share of a limit tracks it; below, the load is "well under"
TRACKING_SHARE = 0.5


def tracks(t: Throttle, dimension: str) -> bool:
    """Was the load pushing against this dimension when the refused request was sent?"""
    limit = t.limits.get(dimension)
    if dimension == CONCURRENCY:
        if limit is None or t.in_flight is None:
            return False
        return t.in_flight >= TRACKING_SHARE * limit.value
    if dimension == REQUESTS:
        if limit is None:
            return t.adaptive  # nothing known: the first 429 is where learning starts
        return t.sending_rate is not None and t.sending_rate >= TRACKING_SHARE * limit.value
    return False  # tokens sent are not metered: only the provider's headers speak for them


def judge(t: Throttle) -> Verdict:
    """Limit or noise, and which dimensions a limit is about.

    - The 429's own headers report a quota spent: a limit, on that dimension.
    - The provider names concurrency: a limit on it, unless far fewer calls were in flight
      than the limit in force (noise).
    - 429s make up a large share of recent answers: a limit, whatever the load (a configured
      limit above the provider's real one shows this way).
    - The load sat at a configured or published limit: noise. The provider's own figure is the
      best account of its limits; a spontaneous 429 there is not a reason to doubt it (a
      lower real limit shows as persistent 429s).
    - The load was well under every limit in force: noise, even with a dimension nothing is
      known of (a limit there would have shown at the higher load the others allow).
    - The load tracked a learned limit or a slow-start window (then dimensions nothing is
      known of are suspects too), or nothing limits the resource yet: a limit.
    """
    if t.exhausted:
        return Verdict(True, t.exhausted, "the provider's headers report the quota spent")
    if t.concurrency_hint:
        if t.persistent or tracks(t, CONCURRENCY) or t.limits.get(CONCURRENCY) is None:
            return Verdict(True, frozenset({CONCURRENCY}), "too many concurrent requests")
        return Verdict(False, frozenset(), "a concurrency refusal well under the in-flight limit")
    tracking = frozenset(d for d in DIMENSIONS if tracks(t, d))
    if t.persistent:
        return Verdict(True, tracking or frozenset({REQUESTS}), "429s persist")
    known = {d: limit for d in DIMENSIONS if (limit := t.limits.get(d)) and not limit.guess}
    tracked = {d for d in tracking if d in known}
    if any(known[d].source != LEARNED for d in tracked):
        return Verdict(False, frozenset(), "at the provider's own limit: a spontaneous 429")
    if known and not tracked:
        # Had a limit nobody knows of been the cause, it would have shown at the higher load
        # the known limits allow.
        return Verdict(False, frozenset(), "the load was well under every limit in force")
    if tracking:
        return Verdict(True, tracking, "the load tracked the estimate")
    return Verdict(False, frozenset(), "nothing to learn, and no sign of a limit")


class Persistence:
    """Decaying counts of one resource's answers and 429s in this process: is the share of
    429s more than spontaneous refusals explain?"""

    def __init__(self, tau_s: float, share: float, least: float) -> None:
        self._tau = tau_s
        self._share = share
        self._least = least  # this many 429s and five times as many answers, at least
        self._answers = 0.0
        self._throttles = 0.0
        self._at: float | None = None

    def record(self, now: float, *, throttled: bool) -> None:
        self._decay(now)
        self._answers += 1
        self._throttles += throttled

    def persistent(self, now: float) -> bool:
        self._decay(now)
        return (
            self._throttles >= self._least
            and self._answers >= 5 * self._least
            and self._throttles >= self._share * self._answers
        )

    def _decay(self, now: float) -> None:
        if self._at is not None and now > self._at:
            keep = math.exp(-(now - self._at) / self._tau)
            self._answers *= keep
            self._throttles *= keep
        self._at = now if self._at is None else max(self._at, now)
