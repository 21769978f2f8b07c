"""Money as values: what a provider billed (usage), what it costs (price), what a tenant may
spend (budget). The one place a cost is computed from a price and a usage. No I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: tokens priced per million
MILLION = 1_000_000.0


@dataclass(frozen=True)
class Usage:
    """What one provider call billed. A provider that reports one unsplit count (``tokens``,
    ``total_tokens``, or a bare number) has it counted as input tokens."""

    input_tokens: float = 0.0
    output_tokens: float = 0.0
    images: float = 0.0
    #: the provider tier it was billed on (core/tiers.py): the batch and flex tiers cost less
    tier: str = "sync"


@dataclass(frozen=True)
class Price:
    """A kind's (or a resource's) price list, in the deployment's currency."""

    input_per_1m: float = 0.0
    output_per_1m: float = 0.0
    per_request: float = 0.0
    per_image: float = 0.0
    #: what the batch and flex tiers cost: a share of this price, or their own token prices
    batch_discount: float = 0.5
    batch_input_per_1m: float | None = None
    batch_output_per_1m: float | None = None

    def on(self, tier: str) -> Price:
        """This price list as a call on ``tier`` is billed (batch and flex: the batch price)."""
        if tier == "sync":
            return self
        share = self.batch_discount
        return Price(
            self.input_per_1m * share
            if self.batch_input_per_1m is None
            else self.batch_input_per_1m,
            self.output_per_1m * share
            if self.batch_output_per_1m is None
            else self.batch_output_per_1m,
            self.per_request * share,
            self.per_image * share,
            batch_discount=1.0,
        )

    def cost(self, usage: Usage) -> float:
        """The cost of one billed call."""
        return (
            self.per_request
            + usage.input_tokens * self.input_per_1m / MILLION
            + usage.output_tokens * self.output_per_1m / MILLION
            + usage.images * self.per_image
        )

    def estimate(self, units: float, *, images: bool) -> float:
        """An upper bound of a task's cost before it runs, from the kind's estimate in its
        metered unit (images for an image endpoint, tokens otherwise). The estimate does not
        split input from output, so every token is priced at the dearer rate."""
        if images:
            return self.cost(Usage(images=units))
        dearer = max(self.input_per_1m, self.output_per_1m)
        return self.per_request + units * dearer / MILLION

    @property
    def free(self) -> bool:
        return not (self.input_per_1m or self.output_per_1m or self.per_request or self.per_image)


@dataclass(frozen=True)
class Charge:
    """A billed call as the ledger records it: its usage and its cost. ``possibly``: nobody
    saw the call end, so it is recorded at its estimate, as if billed (the hang-up rule)."""

    usage: Usage
    cost: float
    #: the tier the call was sent on, and what it saved against the sync price
    tier: str = "sync"
    tier_saved: float = 0.0
    possibly: bool = False


def possibly_billed(estimate: float) -> Charge | None:
    """The charge of an attempt nobody saw end: its priced estimate (None: it held nothing)."""
    return Charge(Usage(), estimate, possibly=True) if estimate > 0 else None


@dataclass(frozen=True)
class Budget:
    """What a tenant may spend per period. Periods are aligned on the Unix epoch (a "1d"
    budget resets at 00:00 UTC), so every process computes the same ones."""

    amount: float
    period_s: float

    def period_start(self, now: float) -> float:
        return math.floor(now / self.period_s) * self.period_s

    def resets_at(self, now: float) -> float:
        return self.period_start(now) + self.period_s
