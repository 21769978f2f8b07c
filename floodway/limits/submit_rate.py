"""Per-tenant submission rate (``tenants.submit_rate = "1/10s"``): a token bucket per tenant.

``N/period`` is a bucket of ``N`` that refills over ``period``: a tenant may submit ``N`` at
once, then one more every ``period / N``. The bucket lives in the limiter backend, so with Redis
every API process shares it. (The interactive depth limit is the store's: it must be checked in
the same transaction as the insert.)
"""

from __future__ import annotations

from floodway.config import TenantConfig, parse_rate
from floodway.limits.backend import AcquireRequest, Bucket, Debit, LimiterBackend


class SubmitRateLimiter:
    def __init__(self, tenants: TenantConfig, backend: LimiterBackend) -> None:
        count, period_s = parse_rate(tenants.submit_rate)
        self._backend = backend
        self._capacity = count
        self._refill = count / period_s if period_s else 0.0

    @property
    def enabled(self) -> bool:
        return self._capacity > 0

    async def check(self, tenant: str) -> float | None:
        """None if ``tenant`` may submit now (and that submit is counted), else the seconds to
        wait (the ``Retry-After`` of the refusal)."""
        if not self.enabled:
            return None
        bucket = Bucket(f"t:{tenant}:submits", self._capacity, self._refill)
        result = await self._backend.acquire(AcquireRequest(debits=(Debit(bucket, 1.0),)))
        if result.granted:
            return None
        # A bucket of at least one refilling at a positive rate always has a finite wait.
        return result.retry_in if result.retry_in is not None else 1.0 / self._refill
