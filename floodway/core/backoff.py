"""Exponential backoff with full jitter: the one way floodway spaces out attempts (retries,
polls, webhook redeliveries, the client's polling)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base_s: float = 1.0
    cap_s: float = 60.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full jitter: uniform over [0, min(cap, base * 2^(attempt-1))]."""
        ceiling = min(self.cap_s, self.base_s * (2 ** max(0, attempt - 1)))
        return (rng or random).uniform(0.0, ceiling)
