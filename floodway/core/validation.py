"""Checks on what callers send, shared by the library and the API."""

from __future__ import annotations

import math

from floodway.core.errors import InvalidInput

MAX_DEPTH = 32


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
