"""From a resource's published limits to what floodway enforces: headroom, bucket capacity, keys.

The one subtle number is a bucket's capacity. Providers count "N per minute" over a sliding
60 s window (so does floodway's simulator). A token bucket of capacity ``C`` refilling at ``r``
admits at most ``C + 60 r`` in any 60 s span: a full bucket is spent at once, and the refill of
the next minute follows. With ``r = headroom * L / 60`` for a published limit ``L``, staying
within the provider's window needs ``C <= (1 - headroom) * L``, that is a burst of
``60 * (1 - headroom) / headroom`` seconds of refill: 15 s at headroom 0.8, 60 s at 0.5 (the
cap: a bucket never holds more than a minute at headroom). At headroom 1.0 there is no margin
left to burst into, so the default floors at one second of refill (and one unit): the price of
configuring no headroom is that one window may see a second's worth more than the limit.
An explicit ``burst`` is taken as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from floodway.config import ResourceConfig
from floodway.core.errors import InvalidInput
from floodway.limits.backend import Bucket

WINDOW_S = 60.0  # providers publish limits per minute
MIN_BURST_S = 1.0


class CostTooLarge(InvalidInput):
    """A task's cost exceeds what a bucket can ever hold: it could never be admitted."""

    def __init__(self, resource: str, dimension: str, cost: float, capacity: float, why: str):
        self.resource, self.dimension = resource, dimension
        self.cost, self.capacity = cost, capacity
        super().__init__(
            f"a task costing {cost:g} {dimension} can never run on resource {resource!r}: its "
            f"{dimension} bucket holds at most {capacity:g} ({why}). Split the task, or let "
            f"the bucket hold more: set the resource's `burst` (seconds of refill), or lower "
            f"its `headroom` (the default burst is 60 x (1 - headroom) / headroom seconds, "
            f"15 s at 0.8, so that a full bucket plus a minute of refill stays within the "
            f"provider's per-minute limit)"
        )


def default_burst_s(headroom: float) -> float:
    """Seconds of refill a bucket holds when ``burst`` is not set (see the module doc)."""
    return min(WINDOW_S, max(MIN_BURST_S, WINDOW_S * (1.0 - headroom) / headroom))


@dataclass(frozen=True)
class BucketPlan:
    dimension: str  # "requests" | "tokens"
    key: str
    capacity: float
    rate_per_s: float  # at headroom, before the adaptive factor
    burst_s: float

    def at(self, rate_per_s: float) -> Bucket:
        """The bucket refilling at ``rate_per_s`` (a lowered estimate, say) with its capacity
        unchanged, so a task that fits keeps fitting while the rate is lowered."""
        return Bucket(self.key, self.capacity, rate_per_s)


@dataclass(frozen=True)
class ResourcePlan:
    name: str
    config: ResourceConfig
    concurrency: int  # in-flight cap at headroom; 0 = none
    requests: BucketPlan | None
    tokens: BucketPlan | None

    @classmethod
    def build(cls, name: str, config: ResourceConfig) -> ResourcePlan:
        h = config.headroom
        concurrency = 0
        if config.concurrency:
            # 1e-9 absorbs float noise (10 * 0.7 == 7.000000000000001); never below one slot.
            concurrency = max(1, math.floor(config.concurrency * h + 1e-9))
        return cls(
            name=name,
            config=config,
            concurrency=concurrency,
            requests=_bucket(name, "requests", config.requests_per_minute, config),
            tokens=_bucket(name, "tokens", config.tokens_per_minute, config),
        )

    # Keys of this resource's state in the backend. "r:" never collides with a tenant's "t:".
    @property
    def slot_key(self) -> str:
        return f"r:{self.name}:slots"

    @property
    def sent_key(self) -> str:
        """The calls sent and not yet answered (adaptive resources): a slot is taken at
        admission, a call may go out later."""
        return f"r:{self.name}:sent"

    @property
    def gate_key(self) -> str:
        return f"r:{self.name}:pause"

    @property
    def estimates_key(self) -> str:
        return f"r:{self.name}:estimates"

    @property
    def adaptive(self) -> bool:
        return self.config.adaptive

    @property
    def limited(self) -> bool:
        """Anything to enforce? An adaptive resource with no figures still honours pauses."""
        return bool(self.concurrency or self.requests or self.tokens or self.adaptive)

    @property
    def takes_slots(self) -> bool:
        """Every call holds a slot: to cap them, or (adaptive) to count them."""
        return bool(self.concurrency) or self.adaptive

    def buckets(self) -> list[BucketPlan]:
        return [b for b in (self.requests, self.tokens) if b is not None]

    def configured(self, dimension: str) -> float | None:
        """The configured limit of a dimension at headroom (slots, or per second)."""
        if dimension == "concurrency":
            return float(self.concurrency) if self.concurrency else None
        bucket = self.requests if dimension == "requests" else self.tokens
        return None if bucket is None else bucket.rate_per_s

    def bucket(self, dimension: str, rate_per_s: float, *, published: bool) -> Bucket:
        """The bucket of a rate dimension refilling at ``rate_per_s``. A configured one keeps
        its capacity; a published figure gets the default burst at this headroom (as if it
        were configured); a learned one a second of refill: a guess should not burst."""
        planned = self.requests if dimension == "requests" else self.tokens
        if planned is not None:
            return planned.at(rate_per_s)
        burst = default_burst_s(self.config.headroom) if published else MIN_BURST_S
        return Bucket(f"r:{self.name}:{dimension}", max(1.0, rate_per_s * burst), rate_per_s)

    def check_fits(self, cost: float) -> None:
        if self.tokens is not None and cost > self.tokens.capacity:
            t = self.tokens
            why = (
                f"tokens_per_minute {self.config.tokens_per_minute:g} x headroom "
                f"{self.config.headroom:g} = {t.rate_per_s:g}/s, times a burst of {t.burst_s:g} s"
            )
            raise CostTooLarge(self.name, "tokens", cost, t.capacity, why)


def tenant_slot_key(tenant: str) -> str:
    return f"t:{tenant}:slots"


def _bucket(
    resource: str, dimension: str, per_minute: float, config: ResourceConfig
) -> BucketPlan | None:
    if not per_minute:
        return None
    rate = per_minute * config.headroom / WINDOW_S
    burst = config.burst or default_burst_s(config.headroom)
    # Rounded: 60 * (1 - 0.8) / 0.8 is 14.999999999999996, and 119.99999999999997 requests
    # would admit 119, not 120.
    capacity = max(1.0, round(rate * burst, 9))
    return BucketPlan(dimension, f"r:{resource}:{dimension}", capacity, rate, burst)
