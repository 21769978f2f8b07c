"""Requests and tokens per minute as a sliding 60 s window, or requests as a token bucket.

A sliding window is the strictest honest reading of "N per minute": no 60 s span ever holds more
than N admitted requests, so a scheduler that stays under the published figure never sees a 429,
and one that bursts past it always does. Many providers enforce a token bucket instead (a burst
of ``capacity`` at once, then ``N / 60`` per second); ``rpm_burst`` selects that for requests.
"""

from __future__ import annotations

import math
from collections import deque

WINDOW_S = 60.0


class RateWindow:
    """The requests admitted in the last minute and their token cost."""

    def __init__(self, rpm: int, tpm: int, span_s: float = WINDOW_S, rpm_burst: int = 0) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._span = span_s
        self._admitted: deque[tuple[float, int]] = deque()
        self._tokens = 0
        self._bucket = RequestBucket(rpm, rpm_burst) if rpm and rpm_burst else None

    @property
    def limited(self) -> bool:
        return bool(self.rpm or self.tpm)

    @property
    def exact(self) -> bool:
        """Whether its waits are exact (a bucket): worth a Retry-After-Ms."""
        return self._bucket is not None

    def clear(self) -> None:
        self._admitted.clear()
        self._tokens = 0
        if self._bucket is not None:
            self._bucket.clear()

    def wait_for(self, tokens: int, now: float) -> tuple[float, str] | None:
        """Seconds until a request costing ``tokens`` fits, and which limit holds it back;
        None when it fits now."""
        self._expire(now)
        waits: list[tuple[float, str]] = []
        if self._bucket is not None:
            wait = self._bucket.wait(now)
            if wait > 0:
                waits.append((wait, "requests per minute limit"))
        elif self.rpm and len(self._admitted) >= self.rpm:
            # Enough of the oldest entries must leave for one more request to fit.
            blocking = self._admitted[len(self._admitted) - self.rpm]
            waits.append((blocking[0] + self._span - now, "requests per minute limit"))
        if self.tpm and self._tokens + tokens > self.tpm:
            excess = self._tokens + tokens - self.tpm
            waits.append((self._token_wait(excess, now), "tokens per minute limit"))
        return max(waits) if waits else None

    def record(self, tokens: int, now: float) -> None:
        if self._bucket is not None:
            self._bucket.take(now)
        # Free requests weigh nothing when only tokens are limited: keep the deque short.
        if (self.rpm and self._bucket is None) or (self.tpm and tokens):
            self._admitted.append((now, tokens))
            self._tokens += tokens

    def headers(self, now: float) -> list[tuple[bytes, bytes]]:
        """The x-ratelimit-* headers of the limited dimensions."""
        return [header for quota in self.quotas(now) for header in _dimension(*quota)]

    def quotas(self, now: float) -> list[tuple[str, int, int, float]]:
        """Each limited dimension ("requests", "tokens"): its limit, what is used of it, and
        the seconds until it is back to its full quota."""
        if not self.limited:
            return []
        self._expire(now)
        out: list[tuple[str, int, int, float]] = []
        if self._bucket is not None:
            level = self._bucket.level(now)
            full_in = (self._bucket.capacity - level) / self._bucket.rate
            out.append(("requests", self.rpm, self.rpm - math.floor(level), full_in))
        elif self.rpm:
            newest = self._admitted[-1][0] if self._admitted else None
            out.append(("requests", self.rpm, len(self._admitted), self._reset(newest, now)))
        if self.tpm:
            newest = next((ts for ts, cost in reversed(self._admitted) if cost), None)
            out.append(("tokens", self.tpm, self._tokens, self._reset(newest, now)))
        return out

    def _reset(self, newest: float | None, now: float) -> float:
        # "reset" follows OpenAI: time until the dimension is back to its full quota.
        return 0.0 if newest is None else max(0.0, newest + self._span - now)

    def _token_wait(self, excess: int, now: float) -> float:
        freed = 0
        for ts, cost in self._admitted:
            freed += cost
            if freed >= excess:
                return ts + self._span - now
        return 0.0  # unreachable while excess <= tokens in window; callers reject larger ones

    def _expire(self, now: float) -> None:
        horizon = now - self._span
        while self._admitted and self._admitted[0][0] <= horizon:
            self._tokens -= self._admitted.popleft()[1]


class RequestBucket:
    """``rpm`` requests per minute as a token bucket of ``capacity``, full at first."""

    def __init__(self, rpm: int, capacity: int) -> None:
        self.rate = rpm / WINDOW_S
        self.capacity = float(capacity)
        self._level = self.capacity
        self._at: float | None = None

    def clear(self) -> None:
        self._level, self._at = self.capacity, None

    def level(self, now: float) -> float:
        if self._at is None:
            return self._level
        return min(self.capacity, self._level + max(0.0, now - self._at) * self.rate)

    def wait(self, now: float) -> float:
        """Seconds until one request fits (0: now)."""
        return max(0.0, (1.0 - self.level(now)) / self.rate)

    def take(self, now: float) -> None:
        self._level, self._at = self.level(now) - 1.0, now


def _dimension(name: str, limit: int, used: int, reset: float) -> list[tuple[bytes, bytes]]:
    return [
        (f"x-ratelimit-limit-{name}".encode(), str(limit).encode()),
        (f"x-ratelimit-remaining-{name}".encode(), str(max(0, limit - used)).encode()),
        (f"x-ratelimit-reset-{name}".encode(), format_seconds(reset).encode()),
    ]


def format_seconds(seconds: float) -> str:
    """``1.5`` -> ``"1.5s"``, ``60.0`` -> ``"60s"``: the form providers put in reset headers."""
    return f"{round(seconds, 3):g}s"
