"""Per-tenant submission rate, and choosing the admission for a configuration."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from floodway.config import Settings, TenantConfig
from floodway.core.task import Candidate, Lane
from floodway.kinds import KindRegistry, KindSpec
from floodway.limits.admission import LimitsAdmission
from floodway.limits.base import NoLimits
from floodway.limits.factory import KindResources, build_admission, build_backend
from floodway.limits.local import LocalLimiterBackend
from floodway.limits.redis_backend import RedisLimiterBackend
from floodway.limits.submit_rate import SubmitRateLimiter
from floodway.testing import FakeClock


async def test_one_per_ten_seconds_per_tenant() -> None:
    clock = FakeClock()
    limiter = SubmitRateLimiter(TenantConfig(submit_rate="1/10s"), LocalLimiterBackend(clock))
    assert await limiter.check("a") is None
    assert await limiter.check("a") == pytest.approx(10.0)
    assert await limiter.check("b") is None  # tenants do not share
    await clock.advance(4.0)
    assert await limiter.check("a") == pytest.approx(6.0)
    await clock.advance(6.0)
    assert await limiter.check("a") is None


async def test_a_burst_of_n_then_one_per_share() -> None:
    clock = FakeClock()
    limiter = SubmitRateLimiter(TenantConfig(submit_rate="3/m"), LocalLimiterBackend(clock))
    assert [await limiter.check("a") for _ in range(3)] == [None, None, None]
    assert await limiter.check("a") == pytest.approx(20.0)


async def test_no_submit_rate_allows_everything() -> None:
    limiter = SubmitRateLimiter(TenantConfig(), LocalLimiterBackend(FakeClock()))
    assert not limiter.enabled
    assert all([await limiter.check("a") is None for _ in range(100)])


async def _handler(ctx: object, value: object) -> object:
    return value


async def test_build_admission() -> None:
    clock = FakeClock()
    kinds = KindRegistry()
    assert isinstance(build_admission(Settings(), kinds, clock), NoLimits)
    settings = Settings(resources={"llm": {"concurrency": 2}})
    admission = build_admission(settings, kinds, clock)
    assert isinstance(admission, LimitsAdmission)
    assert isinstance(admission.backend, LocalLimiterBackend)
    # A kind declared after the admission was built is still limited.
    kinds.add(KindSpec("chat", _handler, resource="llm"))
    kinds.add(KindSpec("free", _handler))
    assert dict(KindResources(kinds)) == {"chat": "llm"}
    ready = [
        Candidate(f"t{i}", "chat", "a", Lane.BACKGROUND, 0.0, i, clock.now(), None)
        for i in range(5)
    ]
    assert len(await admission.admit(ready, clock.now())) == 2


async def test_build_backend_picks_redis_when_configured() -> None:
    settings = Settings(redis="redis://127.0.0.1:6379/0", redis_prefix="staging")
    backend = build_backend(settings, FakeClock())
    assert isinstance(backend, RedisLimiterBackend)  # no connection is made until used
    assert backend.key("x") == "floodway:{staging}:x"
    await backend.aclose()
    with pytest.raises(ValidationError):
        Settings(redis_prefix="a}b")
    assert isinstance(build_backend(Settings(), FakeClock()), LocalLimiterBackend)


async def test_the_local_backend_forgets_idle_tenants() -> None:
    clock = FakeClock()
    backend = LocalLimiterBackend(clock)
    limiter = SubmitRateLimiter(TenantConfig(submit_rate="1/10s"), backend)
    for i in range(3000):
        assert await limiter.check(f"tenant-{i}") is None
    await clock.advance(10.0)  # every one of those buckets is full again
    for i in range(1100):
        await limiter.check(f"other-{i}")
    assert len(backend._buckets) == 1100  # the 3000 full ones went in a sweep
