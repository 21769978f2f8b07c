"""Checks on what callers send, shared by the library and the API."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from floodway.core.addresses import literal_address, refusal
from floodway.core.errors import InvalidInput

MAX_DEPTH = 32
#: a deadline longer than this is a typo, and unbounded floats would overflow the timestamps
MAX_DEADLINE_S = 366 * 86400.0
MAX_ATTEMPTS = 1000


def check_input(value: object, max_depth: int = MAX_DEPTH) -> None:
    """Task input must be a JSON object of bounded depth with finite numbers. The walk admits
    only what ``json.dumps(allow_nan=False)`` writes (string keys; no tuples, sets or bytes),
    so the input is not encoded here just to see that it can be."""
    if not isinstance(value, dict):
        raise InvalidInput(f"input must be a JSON object, not {type(value).__name__}")
    _walk(value, 1, max_depth)


def _walk(value: object, depth: int, max_depth: int) -> None:
    if depth > max_depth:
        raise InvalidInput(f"input is nested deeper than {max_depth} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidInput(f"input keys must be strings, not {type(k).__name__}")
            _walk(v, depth + 1, max_depth)
    elif isinstance(value, list):
        for v in value:
            _walk(v, depth + 1, max_depth)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput("input holds a number that JSON cannot carry (NaN or infinity)")
    elif not isinstance(value, str | int | float | bool) and value is not None:
        raise InvalidInput(f"input is not JSON: a {type(value).__name__} value")


def check_attempts(value: object) -> None:
    """A caller's ``max_attempts`` (None: the kind's)."""
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_ATTEMPTS:
        raise InvalidInput(f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS}")


def check_deadline(value: object) -> None:
    """A caller's ``deadline_s`` (None: the kind's)."""
    if value is None:
        return
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not 0 < value <= MAX_DEADLINE_S
    ):
        raise InvalidInput(
            f"deadline_s must be a number of seconds above 0 and at most {MAX_DEADLINE_S:.0f}"
        )


def host_listed(host: str, allowed: Sequence[str]) -> bool:
    """``host`` matches one of ``api.callback_hosts`` (``hooks.example.com``, ``*.example.com``)."""
    return any(fnmatchcase(host.lower(), pattern.lower()) for pattern in allowed)


def check_callback_host(url: str, allowed: Sequence[str]) -> None:
    """``api.callback_hosts``: a listed host may be anywhere; with a list, no other host is
    called; without one, only public addresses are (the host's addresses are checked again
    after DNS resolution at each delivery: :mod:`floodway.core.addresses`)."""
    host = (urlsplit(url).hostname or "").lower()
    if host_listed(host, allowed):
        return
    if allowed:
        raise InvalidInput(
            f"callback_url: host {host!r} is not allowed here (api.callback_hosts: "
            f"{', '.join(allowed)})"
        )
    address = literal_address(host)
    why = None if address is None else refusal(address)
    if why is not None:
        raise InvalidInput(
            f"callback_url: host {host!r} is {why}; callbacks go to public addresses only "
            "unless api.callback_hosts lists the host"
        )


def check_tier(value: object, offered: Sequence[str], kind: str, *, interactive: bool) -> None:
    """A caller's pinned ``tier`` (None: floodway chooses): one the kind offers; never
    "batch" on the interactive lane, which does not wait for a batch."""
    if value is None:
        return
    if value not in offered:
        raise InvalidInput(
            f"tier {value!r} is not offered by kind {kind!r} (its tiers: {', '.join(offered)})"
        )
    if interactive and value == "batch":
        raise InvalidInput("tier 'batch' is for the background lane: interactive tasks run now")
