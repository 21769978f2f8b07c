"""Reading a provider's ``x-ratelimit-*`` headers (the OpenAI family, which others copy).

``x-ratelimit-remaining-requests: 59`` and ``x-ratelimit-reset-requests: 6m0s`` say what the
provider itself counts, including usage floodway did not see (another client on the same key,
another process with its own local limits). The admission lowers its buckets to these figures,
never raises them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

DIMENSIONS = ("requests", "tokens")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_EPOCH = 1e9  # a bare number this large is an instant, not a duration


@dataclass(frozen=True)
class Remaining:
    dimension: str
    remaining: float
    limit: float | None = None
    reset_s: float | None = None  # seconds until the quota is whole again


def parse_reset(value: str, now: float) -> float | None:
    """``"6m0s"``, ``"1.5s"``, ``"20ms"``, ``"30"`` (seconds) or a Unix time -> seconds from
    ``now``; None if unreadable."""
    text = value.strip().lower()
    try:
        number = float(text)
    except ValueError:
        parts = _PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            return None
        return sum(float(n) * _UNIT_S[u] for n, u in parts)
    if number >= _EPOCH:
        return max(0.0, number - now)
    return max(0.0, number)


def read_remaining(headers: Mapping[str, str], now: float) -> list[Remaining]:
    lower = {k.lower(): v for k, v in headers.items()}
    found: list[Remaining] = []
    for dim in DIMENSIONS:
        remaining = _number(lower.get(f"x-ratelimit-remaining-{dim}"))
        if remaining is None:
            continue
        reset = lower.get(f"x-ratelimit-reset-{dim}")
        found.append(
            Remaining(
                dimension=dim,
                remaining=remaining,
                limit=_number(lower.get(f"x-ratelimit-limit-{dim}")),
                reset_s=None if reset is None else parse_reset(reset, now),
            )
        )
    return found


def exhausted_pause(r: Remaining, need: float) -> float | None:
    """How long to hold a resource whose provider has less than ``need`` left, or None.

    ``reset`` is the time until the whole quota is back; a sliding window frees room sooner,
    so with the published limit known the pause is the time the missing units take at the
    provider's average rate (``reset * missing / limit``); without it, the whole reset."""
    missing = max(1.0, need) - r.remaining
    if missing <= 0 or not r.reset_s:
        return None
    if r.limit:
        return min(r.reset_s, r.reset_s * missing / r.limit)
    return r.reset_s


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None
