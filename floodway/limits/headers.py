"""Reading the limits a provider publishes in its response headers.

Three families are read, each into the same :class:`Quota` (a dimension's limit per window,
what is left of it and when it is whole again):

* **OpenAI** (and the many APIs that copy it): ``x-ratelimit-limit-requests: 60``,
  ``x-ratelimit-remaining-requests: 59``, ``x-ratelimit-reset-requests: 6m0s``, the same for
  ``-tokens``. Limits are per minute.
* **Anthropic**: ``anthropic-ratelimit-requests-limit`` / ``-remaining`` / ``-reset`` (an RFC
  3339 instant), the same for ``tokens``, ``input-tokens`` and ``output-tokens``. Limits are per
  minute. floodway meters one tokens dimension, so each of the three is read as a tokens quota:
  the admission takes the most restrictive.
* **IETF** ``RateLimit`` / ``RateLimit-Policy`` (draft-ietf-httpapi-ratelimit-headers, as
  structured fields: ``RateLimit-Policy: "default";q=100;w=60``, ``RateLimit: "default";r=42;
  t=30``, with ``qu`` naming the unit: ``requests`` (the default), ``content-bytes`` and
  ``concurrent-requests``), and the earlier drafts' ``RateLimit-Limit`` / ``-Remaining`` /
  ``-Reset`` with ``RateLimit-Policy: 100;w=60``.

They say what the provider itself counts, including usage floodway did not see (another client
on the same key). The admission lowers its buckets to what is left, pauses a resource whose
quota is spent, and takes the published limits for the dimensions nobody configured.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import http_sf

REQUESTS = "requests"
TOKENS = "tokens"
CONCURRENCY = "concurrency"
MINUTE_S = 60.0  # OpenAI and Anthropic publish limits per minute

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_EPOCH = 1e9  # a bare number this large is an instant, not a duration
_ANTHROPIC = {
    "requests": REQUESTS,
    "tokens": TOKENS,
    "input-tokens": TOKENS,
    "output-tokens": TOKENS,
}
#: IETF quota units -> floodway's dimensions (content-bytes has no counterpart: not read)
_IETF_UNITS = {"requests": REQUESTS, "concurrent-requests": CONCURRENCY}


@dataclass(frozen=True)
class Quota:
    """One published quota. ``limit`` is per ``window_s`` (for concurrency: in flight)."""

    dimension: str  # REQUESTS | TOKENS | CONCURRENCY
    limit: float | None = None
    window_s: float | None = None
    remaining: float | None = None
    reset_s: float | None = None  # seconds until the quota is whole again

    @property
    def per_second(self) -> float | None:
        """The published rate (per second), for the rate dimensions."""
        if self.limit is None or not self.window_s or self.dimension == CONCURRENCY:
            return None
        return self.limit / self.window_s


def parse_reset(value: str, now: float) -> float | None:
    """``"6m0s"``, ``"1.5s"``, ``"20ms"``, ``"30"`` (seconds), a Unix time or an RFC 3339
    instant -> seconds from ``now``; None if unreadable."""
    text = value.strip().lower()
    try:
        number = float(text)
    except ValueError:
        parts = _PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT_S[u] for n, u in parts)
        return _instant(value.strip(), now)
    if number >= _EPOCH:
        return max(0.0, number - now)
    return max(0.0, number)


def read_quotas(headers: Mapping[str, str], now: float) -> list[Quota]:
    """Every quota the headers publish, from whichever families are present."""
    lower = {k.lower(): v for k, v in headers.items()}
    return [*_openai(lower, now), *_anthropic(lower, now), *_ietf(lower)]


def exhausted_pause(q: Quota, need: float) -> float | None:
    """How long to hold a resource whose provider has less than ``need`` left, or None.

    ``reset`` is the time until the whole quota is back; a sliding window frees room sooner,
    so with the published limit known the pause is the time the missing units take at the
    provider's average rate (``reset * missing / limit``); without it, the whole reset."""
    if q.remaining is None:
        return None
    missing = max(1.0, need) - q.remaining
    if missing <= 0 or not q.reset_s:
        return None
    if q.limit:
        return min(q.reset_s, q.reset_s * missing / q.limit)
    return q.reset_s


def _openai(lower: Mapping[str, str], now: float) -> list[Quota]:
    triples = [(dim, f"x-ratelimit-{{}}-{dim}") for dim in (REQUESTS, TOKENS)]
    return _quotas(lower, triples, now)


def _anthropic(lower: Mapping[str, str], now: float) -> list[Quota]:
    triples = [(dim, f"anthropic-ratelimit-{name}-{{}}") for name, dim in _ANTHROPIC.items()]
    return _quotas(lower, triples, now)


def _quotas(lower: Mapping[str, str], triples: list[tuple[str, str]], now: float) -> list[Quota]:
    """(dimension, header name with ``{}`` for limit / remaining / reset): a quota for each
    whose limit or remaining is sent."""
    found = []
    for dim, header in triples:
        limit = _number(lower.get(header.format("limit")))
        remaining = _number(lower.get(header.format("remaining")))
        if limit is not None or remaining is not None:
            reset = _reset(lower.get(header.format("reset")), now)
            found.append(Quota(dim, limit, MINUTE_S, remaining, reset))
    return found


def _ietf(lower: Mapping[str, str]) -> list[Quota]:
    """The structured ``RateLimit-Policy`` + ``RateLimit`` pair, else the older triple."""
    policies = _structured(lower.get("ratelimit-policy"))
    current = _structured(lower.get("ratelimit"))
    named = {name: params for name, params in current if isinstance(name, str)}
    found: list[Quota] = []
    for name, params in policies:
        if not isinstance(name, str):
            continue  # an earlier draft's "100;w=60": read with the triple below
        dimension = _IETF_UNITS.get(str(params.get("qu", "requests")))
        quota = _param(params, "q")
        if dimension is None or quota is None:
            continue
        now_params = named.get(name, {})
        found.append(
            Quota(
                dimension,
                quota,
                _param(params, "w"),
                _param(now_params, "r"),
                _param(now_params, "t"),
            )
        )
    return found or _ietf_triple(lower, policies)


Members = list[tuple[object, dict[str, object]]]


def _ietf_triple(lower: Mapping[str, str], policies: Members) -> list[Quota]:
    limit = _number(lower.get("ratelimit-limit"))
    remaining = _number(lower.get("ratelimit-remaining"))
    if limit is None and remaining is None:
        return []
    window = next((_param(p, "w") for v, p in policies if v == limit), None)
    return [Quota(REQUESTS, limit, window, remaining, _number(lower.get("ratelimit-reset")))]


def _structured(value: str | None) -> Members:
    """A structured-field list as (value, parameters) members; empty if absent or malformed
    (a provider's broken header must not break the call that carried it)."""
    if not value:
        return []
    try:
        parsed = http_sf.parse(value.encode(), tltype="list")
    except (http_sf.StructuredFieldError, ValueError, UnicodeError):
        return []
    members: Members = []
    for member in parsed if isinstance(parsed, list) else []:
        if isinstance(member, tuple) and isinstance(member[1], dict):
            item, params = member
            if not isinstance(item, list):  # inner lists carry no quota
                members.append((item, dict(params)))
    return members


def _param(params: Mapping[str, object], name: str) -> float | None:
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= 0 else None


def _reset(value: str | None, now: float) -> float | None:
    return None if value is None else parse_reset(value, now)


def _instant(text: str, now: float) -> float | None:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number >= 0 and number == number else None
