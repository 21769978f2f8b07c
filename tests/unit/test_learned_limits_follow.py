"""Learned limits against a model provider whose limits change, on a fake clock: a drop and a
raise are both followed, and a refusal never cuts the in-flight cap below half the true one.

The provider here is a model, not the simulator: calls end after a fixed latency, a rate is a
token bucket of ``BURST`` with an exact Retry-After, an in-flight cap refuses a call that
arrives with the cap already in use. A call admitted may go out late (a worker slow to
start it), when more are in flight than at its admission. Nothing is configured but ``adaptive``.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from floodway.config import ResourceConfig
from floodway.limits.base import Permit, Settlement
from tests.unit.test_limits_admission import Rig, cand, rig

BURST = 10.0
CONCURRENCY_REFUSAL = "rate_limited: concurrency limit"
LATE_EVERY = 3


@dataclass
class Provider:
    rate_per_s: Callable[[float], float] | None = None  # seconds into the run -> rate
    cap: Callable[[float], int] | None = None
    latency_s: float = 0.05
    jitter: float = 0.2  # each call takes latency_s +- this share of it
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    level: float = BURST
    in_flight: int = 0
    requests: int = 0
    refused: int = 0
    refused_rates_at: list[float] = field(default_factory=list)  # seconds into the run

    def refill(self, t: float, dt: float) -> None:
        if self.rate_per_s is not None:
            self.level = min(BURST, self.level + self.rate_per_s(t) * dt)

    def latency(self, accepted: bool) -> float:
        """A refusal is answered at once."""
        if not accepted:
            return 0.001
        return self.latency_s * (1 + self.rng.uniform(-self.jitter, self.jitter))

    def arrive(self, t: float) -> tuple[bool, float | None, str]:
        """(accepted, Retry-After, reason) for a call arriving ``t`` seconds into the run."""
        self.requests += 1
        if self.cap is not None and self.in_flight >= self.cap(t):
            self.refused += 1
            return False, 1.0, CONCURRENCY_REFUSAL
        if self.rate_per_s is not None:
            if self.level < 1.0:
                self.refused += 1
                self.refused_rates_at.append(t)
                return False, (1.0 - self.level) / self.rate_per_s(t), "rate_limited"
            self.level -= 1.0
        self.in_flight += 1
        return True, None, ""


@dataclass
class Run:
    r: Rig
    provider: Provider
    samples: list[tuple[float, float]] = field(default_factory=list)  # (t, limit in force)
    least_after_refusal: float = math.inf
    step_s: float = 0.01  # the fake clock's step: well under a call's latency
    late_s: float = 0.0  # every LATE_EVERY-th call admitted in a pass goes out this late

    async def drive(self, seconds: float, dimension: str, waiting: int = 60) -> None:
        """Keep ``waiting`` tasks ready, send what is admitted, answer after the latency."""
        ids = itertools.count()
        ready = {f"t{i}": cand(f"t{i}") for i in (next(ids) for _ in range(waiting))}
        calls: list[tuple[float, Permit, bool, float | None, str]] = []
        outbox: list[tuple[float, Permit]] = []  # (send at, permit)
        start = self.r.now
        next_sample = 0.0
        while (t := self.r.now - start) < seconds:
            due = [c for c in calls if c[0] <= self.r.now]
            calls = [c for c in calls if c[0] > self.r.now]
            for _end, permit, accepted, retry_after, reason in due:
                if accepted:
                    self.provider.in_flight -= 1
                settlement = Settlement(
                    throttled=not accepted, retry_after=retry_after, reason=reason
                )
                await self.r.adm.settle(permit, settlement, self.r.now)
            for i, permit in enumerate(await self.r.adm.admit(list(ready.values()), self.r.now)):
                del ready[permit.task_id]
                fresh = f"t{next(ids)}"
                ready[fresh] = cand(fresh)
                outbox.append((self.r.now + (self.late_s if i % LATE_EVERY == 0 else 0), permit))
            sending = [p for at, p in outbox if at <= self.r.now]
            outbox = [(at, p) for at, p in outbox if at > self.r.now]
            for permit in sending:
                sent = await self.r.adm.sending(permit)
                accepted, retry_after, reason = self.provider.arrive(t)
                latency = self.provider.latency(accepted)
                calls.append((self.r.now + latency, sent, accepted, retry_after, reason))
            if t >= next_sample:
                limit = (await self.r.adm.snapshot())["llm"].limits.get(dimension)
                if limit is not None:
                    self.samples.append((t, limit.value))
                    if self.provider.refused:
                        self.least_after_refusal = min(self.least_after_refusal, limit.value)
                next_sample += 0.1
            self.provider.refill(t, self.step_s)
            await self.r.clock.advance(self.step_s)

    def first(self, after: float, test: Callable[[float], bool]) -> float | None:
        """Seconds after ``after`` until the limit in force first passed ``test``."""
        return next((t - after for t, v in self.samples if t >= after and test(v)), None)


def steps(*changes: tuple[float, float]) -> Callable[[float], float]:
    return lambda t: [value for at, value in changes if at <= t][-1]


async def test_a_learned_rate_follows_a_drop_and_a_raise() -> None:
    per_s = steps((0.0, 600 / 60), (30.0, 240 / 60), (60.0, 900 / 60))
    run = Run(rig(ResourceConfig(adaptive=True)), Provider(rate_per_s=per_s), step_s=0.02)
    await run.drive(90.0, "requests", waiting=30)
    dropped = run.first(30.0, lambda per_min: per_min <= 1.1 * 240)
    raised = run.first(60.0, lambda per_min: per_min >= 0.9 * 900)
    assert dropped is not None and dropped <= 5.0
    assert raised is not None and raised <= 10.0
    assert run.provider.refused < 0.03 * run.provider.requests


async def test_a_learned_in_flight_cap_follows_a_drop_and_a_raise() -> None:
    cap = steps((0.0, 10), (30.0, 4), (60.0, 16))
    provider = Provider(cap=lambda t: int(cap(t)), latency_s=1.0)
    run = Run(rig(ResourceConfig(adaptive=True)), provider, step_s=0.05)
    await run.drive(90.0, "concurrency", waiting=30)
    dropped = run.first(30.0, lambda slots: int(slots) <= 1.1 * 4)  # whole slots
    raised = run.first(60.0, lambda slots: int(slots) >= 0.9 * 16)
    assert dropped is not None and dropped <= 5.0
    assert raised is not None and raised <= 10.0
    assert run.provider.refused < 0.03 * run.provider.requests


async def test_slow_start_never_cuts_below_half_the_true_cap() -> None:
    provider = Provider(cap=lambda t: 10, latency_s=1.0)
    run = Run(rig(ResourceConfig(adaptive=True)), provider, step_s=0.05, late_s=1.5)
    await run.drive(12.0, "concurrency", waiting=40)
    assert run.provider.refused > 0  # slow start did overshoot
    assert run.least_after_refusal >= 5


async def test_a_probe_at_a_steady_limit_costs_one_refusal_behind_the_providers_burst() -> None:
    """The provider's bucket lets a probe's overshoot through until it is spent, and the
    accepted rate of the last second with it: the cut that ends the probe goes back to the
    last cut (which held), not above the true rate for a second refusal."""
    provider = Provider(rate_per_s=lambda t: 10.0)
    run = Run(rig(ResourceConfig(adaptive=True)), provider, step_s=0.02)
    await run.drive(60.0, "requests", waiting=30)
    refusals = provider.refused_rates_at
    later = [t for t in refusals if t > 1.0]  # past slow start's burst
    probes = [t for i, t in enumerate(later) if i == 0 or t - later[i - 1] > 3.0]
    assert probes, "no probe was refused: the estimate never reached the limit"
    assert len(later) <= len(probes) + 1, refusals
    assert run.provider.refused < 0.02 * run.provider.requests
