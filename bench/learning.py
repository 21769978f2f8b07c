"""L1-L3: learned limits that must follow a provider down and back up (nothing configured but
``adaptive = true``).

    python -m bench.learning              # every scenario, 3 runs each
    python -m bench.learning L3 --runs 4

- L1: the provider's rate is a token bucket of a second's refill (exact Retry-After, no rate
  headers) at 600 requests/min, 240 from 30 s, 900 from 60 s; 50 ms calls, as many tasks as
  the changing rate lets through in 90 s. Optimum: when the provider's bucket, full at the
  start and refilled at the changing rate, has allowed every task, plus one service time.
- L2: an in-flight cap of 10, 4 from 30 s, 16 from 60 s; 1 s calls. Optimum: when the
  changing cap's slot-seconds cover the provider's busy time (the latencies it served).
- L3: slow start against a strict cap of 10, 1 s calls, 200 tasks. Optimum: busy time / cap.

Each run samples the limit in force every 100 ms: ``drop_followed_s`` is how long after a drop
the limit was first within 10 % of the new figure (at most 110 % of it), ``raise_followed_s``
how long after the raise it was first at least 90 % of it (in whole slots for a cap; 30 s:
not within the phase), ``least_learned`` the lowest limit in force after the first 429.
Figures go to ``bench/results/learning-<ID>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.apps.provider import KIND, RESOURCE, provider_settings
from bench.quota import (
    Figures,
    Scenario,
    Summary,
    inputs,
    makespan,
    provider_figures,
    reread,
    run_scenario,
    runtime,
    scratch_database,
    simulator,
    task_figures,
    until_terminal,
)
from floodway import Floodway
from floodway.config import ResourceConfig
from floodway.limits.admission import LimitsAdmission
from floodway.providers.sim import RunningSimulator, SimulatorConfig
from floodway.providers.sim.window import WINDOW_S

SAMPLE_S = 0.1
WORKER_SLOTS = 40
#: (from second, limit): the provider's limit over the run
RATE_STEPS = ((0.0, 600), (30.0, 240), (60.0, 900))
CAP_STEPS = ((0.0, 10), (30.0, 4), (60.0, 16))
RATE_LATENCY_MS = 50.0
CAP_LATENCY_MS = 1000.0
PHASE_S = 30.0
RAISE_SHARE = 0.9


def limit_at(steps: tuple[tuple[float, int], ...], t: float) -> int:
    return [value for start, value in steps if start <= t][-1]


def apply(sim: RunningSimulator, steps: tuple[tuple[float, int], ...], t: float) -> None:
    """Set the provider's limit for second ``t`` of the run (the bucket keeps its level)."""
    value = limit_at(steps, t)
    state = sim.state
    if steps is RATE_STEPS:
        bucket = state.window._bucket
        assert bucket is not None
        now = time.monotonic()
        level = bucket.level(now)
        bucket.rate = value / WINDOW_S
        bucket._level, bucket._at = level, now
    else:
        state.config = state.config.model_copy(update={"max_concurrency": value})


async def sampler(
    fw: Floodway, dimension: str, started: float, out: list[tuple[float, float, int]]
) -> None:
    """(seconds into the run, limit in force, the resource's limit 429s) every SAMPLE_S."""
    admission = fw.runtime.admission
    assert isinstance(admission, LimitsAdmission)
    while True:
        snap = (await admission.snapshot())[RESOURCE]
        limit = snap.limits.get(dimension)
        if limit is not None:
            out.append((time.time() - started, limit.value, snap.throttles_limit))
        await asyncio.sleep(SAMPLE_S)


async def driver(sim: RunningSimulator, steps: tuple[tuple[float, int], ...], t0: float) -> None:
    for start, _value in steps[1:]:
        await asyncio.sleep(max(0.0, t0 + start - time.time()))
        apply(sim, steps, start)


def followed(
    samples: list[tuple[float, float, int]], steps: tuple[tuple[float, int], ...]
) -> Figures:
    out: Figures = {}
    for (start, value), (_, before) in zip(steps[1:], steps, strict=False):
        after = [(t, v) for t, v, _n in samples if t >= start]
        if value < before:
            hit = next((t for t, v in after if int(v) <= (2 - RAISE_SHARE) * value), None)
            out["drop_followed_s"] = PHASE_S if hit is None else hit - start
        else:
            hit = next((t for t, v in after if int(v) >= RAISE_SHARE * value), None)
            out["raise_followed_s"] = PHASE_S if hit is None else hit - start
            at30 = [v for t, v in after if t <= start + PHASE_S]
            out["limit_30s_after_raise"] = at30[-1] if at30 else None
    return out


def least_learned(samples: list[tuple[float, float, int]]) -> float | None:
    after = [v for _t, v, n in samples if n > 0]
    return min(after) if after else None


@dataclass(frozen=True)
class Case:
    sim: SimulatorConfig
    tasks: int
    steps: tuple[tuple[float, int], ...] | None
    dimension: str
    optimum: Callable[[RunningSimulator], float]


async def learning_run(seed: int, case: Case) -> Figures:
    samples: list[tuple[float, float, int]] = []
    resource = ResourceConfig(adaptive=True)
    async with simulator(case.sim) as sim, scratch_database() as db:
        async with runtime(provider_settings(sim.url, db, resource)) as fw:
            tasks = await fw.submit_many(KIND, inputs(case.tasks, f"learn-{seed}"))
            started = time.time()
            side = [asyncio.create_task(sampler(fw, case.dimension, started, samples))]
            if case.steps is not None:
                side.append(asyncio.create_task(driver(sim, case.steps, started)))
            try:
                async with fw.worker(WORKER_SLOTS):
                    await until_terminal(fw, case.tasks, timeout_s=600)
            finally:
                for s in side:
                    s.cancel()
            final = await reread(fw, tasks)
        provider = provider_figures(sim)
    span = makespan(final, started)
    optimum = case.optimum(sim)
    figures: Figures = {
        **task_figures(final),
        **provider,
        "makespan_s": span,
        "optimum_s": optimum,
        "makespan_over_optimum": span / optimum,
        "share_429": provider["rate_limited_429"] / max(1, provider["requests"]),
        "least_learned": least_learned(samples),
    }
    if case.steps is not None:
        figures.update(followed(samples, case.steps))
    return figures


def rate_optimum(tasks: int, burst: int) -> float:
    """When a bucket of ``burst``, full at 0 and refilled at RATE_STEPS, has let ``tasks``
    through, plus one service time."""
    allowed, t, dt = float(burst), 0.0, 0.001
    while allowed < tasks:
        allowed += limit_at(RATE_STEPS, t) / WINDOW_S * dt
        t += dt
    return t + RATE_LATENCY_MS / 1000


def cap_optimum(busy_s: float) -> float:
    """When the changing cap's slot-seconds reach ``busy_s``."""
    covered, t, dt = 0.0, 0.0, 0.001
    while covered < busy_s:
        covered += limit_at(CAP_STEPS, t) * dt
        t += dt
    return t


def l1_case(seed: int) -> Case:
    burst = 10
    tasks = int(sum(v / WINDOW_S * PHASE_S for _s, v in RATE_STEPS))
    sim = SimulatorConfig(
        latency_ms=RATE_LATENCY_MS,
        latency_jitter=0.2,
        rpm=RATE_STEPS[0][1],
        rpm_burst=burst,
        rate_headers=False,
        seed=seed,
    )
    return Case(sim, tasks, RATE_STEPS, "requests", lambda _sim: rate_optimum(tasks, burst))


def cap_case(seed: int, tasks: int, steps: tuple[tuple[float, int], ...] | None) -> Case:
    sim = SimulatorConfig(
        latency_ms=CAP_LATENCY_MS, latency_jitter=0.2, max_concurrency=10, seed=seed
    )
    if steps is None:
        return Case(sim, tasks, None, "concurrency", lambda s: s.state.stats.busy_s / 10)
    return Case(sim, tasks, steps, "concurrency", lambda s: cap_optimum(s.state.stats.busy_s))


async def l1_run(seed: int, quick: bool) -> Figures:
    return await learning_run(seed, l1_case(seed))


async def l2_run(seed: int, quick: bool) -> Figures:
    tasks = int(sum(v * PHASE_S * 1000 / CAP_LATENCY_MS for _s, v in CAP_STEPS))
    return await learning_run(seed, cap_case(seed, tasks, CAP_STEPS))


async def l3_run(seed: int, quick: bool) -> Figures:
    return await learning_run(seed, cap_case(seed, 200, None))


def check(f: Figures) -> bool:
    raised = f.get("raise_followed_s", 0.0)
    return bool(
        f["makespan_over_optimum"] <= 1.15
        and f["share_429"] < 0.03
        and raised is not None
        and raised <= 10
    )


def l3_check(f: Figures) -> bool:
    return bool(f["makespan_over_optimum"] <= 1.15 and (f["least_learned"] or 0) >= 5)


FOLLOW = ("drop_followed_s", "raise_followed_s", "limit_30s_after_raise")
SCENARIOS: dict[str, Scenario] = {
    s.id: s
    for s in (
        Scenario(
            "L1",
            "provider rate 600 -> 240 -> 900/min (at 30 s, 60 s), a token bucket of 10, exact "
            "Retry-After, no headers; nothing configured but adaptive",
            "raise followed <= 10 s; makespan/optimum <= 1.15; 429s < 3 %",
            l1_run,
            Summary(("makespan_over_optimum", "share_429", *FOLLOW, "least_learned", "makespan_s")),
            check,
            slow=True,
        ),
        Scenario(
            "L2",
            "provider in-flight cap 10 -> 4 -> 16 (at 30 s, 60 s), 1 s calls; nothing "
            "configured but adaptive",
            "raise followed <= 10 s; makespan/optimum <= 1.15; 429s < 3 %",
            l2_run,
            Summary(("makespan_over_optimum", "share_429", *FOLLOW, "least_learned", "makespan_s")),
            check,
            slow=True,
        ),
        Scenario(
            "L3",
            "slow start against a strict cap of 10, 1 s calls, 200 tasks; nothing configured "
            "but adaptive",
            "least learned cap >= 5 (half the cap); makespan/optimum <= 1.15",
            l3_run,
            Summary(("makespan_over_optimum", "share_429", "least_learned", "makespan_s")),
            l3_check,
        ),
    )
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("ids", nargs="*", metavar="ID", help=f"of {', '.join(SCENARIOS)}")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    ids = [i.upper() for i in args.ids] or list(SCENARIOS)
    definitions = (__doc__ or "").partition("- L1")[2]
    for scenario_id in ids:
        run_scenario(
            SCENARIOS[scenario_id],
            args.runs,
            False,
            prefix="learning",
            definitions="L1" + definitions,
        )


if __name__ == "__main__":
    main()
