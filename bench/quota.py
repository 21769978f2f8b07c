"""Q1-Q8: the real engine against the simulated provider's quota.

    python -m bench.quota                  # every scenario, 3 runs each
    python -m bench.quota Q1 Q3 --runs 5
    python -m bench.quota Q2 --quick       # smaller and faster, 1 run: for smoke runs
    python -m bench.quota Q1 --peers       # each run beside Dramatiq's (bench/peer_q1.py)

Every run starts from nothing: a scratch SQLite file, a fresh simulator (in this event loop,
answering over real HTTP on a loopback port), a ``Floodway`` whose kind is declared in
configuration with the ``http`` adapter (as in ``floodway demo``), and an in-process worker.
Figures are medians over the runs (counts that must be zero: the worst run) and go to
``bench/results/quota-<ID>.json``.

The optimum is what the provider's quota allows; each scenario's definition:

- Q1: optimum = provider busy time / cap, where busy time is the sum of the latencies the
  simulator actually served (successes and 5xx alike; a 429 is answered at once and costs
  nothing). The nominal N x mean latency / cap is reported alongside.
- Q2, Q4: optimum = (N - B) / R + d: the provider's rate R per second, less the initial burst B
  of a bucket configured with the provider's own limit at headroom 1.0 (1 s of refill, so
  B = R x 1 s), plus one service time d for the last request to come back.
- Q2b: as Q2's, for a provider that enforces the same limit as an exact token bucket of a
  second's refill (Q6's), so B is both buckets' capacity.
- Q3: small tasks' mean turnaround (submit -> done) with floodway's order, divided by the same
  with order forced to strict FIFO: the same limits, ``AdmissionTuning(aging_s=1e-6)`` (every
  task is "aged" at once, so the sort falls back to submit order and a refused head-of-line
  task reserves the bucket). The bucket-math FIFO prediction is reported as a cross-check.
- Q5: tenant B's mean turnaround behind tenant A's backlog, against B alone on an idle engine;
  the allowance is one service time (the mean latency).
- Q6: as Q2's, for a provider that enforces its 600/min as a token bucket of 10 (so B = 10)
  and publishes no rate-limit headers; floodway knows nothing of it (``adaptive`` only).
- Q7: as Q1's (busy time / cap), the cap unknown to floodway (``adaptive`` only).
- Q8: Q1 twice with the same seed, with and without 2 % spontaneous 429s; the figure is the
  ratio of the two makespans.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import peer_q1
from bench.apps import q1 as q1app
from bench.apps.provider import KIND, RESOURCE, provider_settings
from bench.common import write_result
from floodway import Floodway, Settings, Status
from floodway.clock import SystemClock
from floodway.config import ResourceConfig
from floodway.core.states import TERMINAL
from floodway.core.task import Task
from floodway.limits.admission import AdmissionTuning, LimitsAdmission
from floodway.limits.local import LocalLimiterBackend
from floodway.limits.plan import ResourcePlan
from floodway.providers.sim import RunningSimulator, SimulatorConfig
from floodway.providers.sim import running_simulator as _running_simulator

# ==========================================================================================
# The harness (bench.crash uses it too)
# ==========================================================================================
Figures = dict[str, Any]


@asynccontextmanager
async def simulator(config: SimulatorConfig) -> AsyncIterator[RunningSimulator]:
    async with _running_simulator(config) as sim:
        yield sim


@asynccontextmanager
async def scratch_database() -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory(prefix="floodway-bench-") as tmp:
        yield f"sqlite:///{Path(tmp) / 'bench.db'}"


@asynccontextmanager
async def runtime(
    settings: Settings, tuning: AdmissionTuning | None = None
) -> AsyncIterator[Floodway]:
    """An open Floodway. ``tuning`` replaces the admission's algorithm knobs (same limits),
    e.g. to force FIFO order for a comparison."""
    clock = SystemClock()
    admission = None
    if tuning is not None:
        backend = LocalLimiterBackend(clock)
        admission = LimitsAdmission(
            settings.resources, {KIND: RESOURCE}, settings.tenants, backend, clock, tuning
        )
    fw = Floodway(settings=settings, clock=clock, admission=admission)
    await fw.open()
    try:
        yield fw
    finally:
        await fw.close()


async def terminal_count(fw: Floodway) -> int:
    stats = await fw.store.stats()
    return sum(n for status, n in stats.by_status.items() if Status(status) in TERMINAL)


async def until_terminal(fw: Floodway, count: int, timeout_s: float) -> None:
    """Return once ``count`` tasks of the (scratch) database are terminal.

    One cheap GROUP BY every 50 ms, rather than a waiter per task: hundreds of waiters
    re-reading their rows would load the 2-core machine the engine is measured on. Timings come
    from the tasks' own ``finished_at``, so the polling step does not blur them.
    """
    give_up = time.monotonic() + timeout_s
    while await terminal_count(fw) < count:
        if time.monotonic() > give_up:
            raise TimeoutError(f"fewer than {count} tasks terminal after {timeout_s:g} s")
        await asyncio.sleep(0.05)


async def reread(fw: Floodway, tasks: Iterable[Task]) -> list[Task]:
    return [await fw.get(t.id) for t in tasks]


def inputs(count: int, tag: str, **extra: Any) -> list[dict[str, Any]]:
    """Distinct inputs: identical ones would be deduplicated by their work fingerprint."""
    return [{"tag": tag, "n": i, **extra} for i in range(count)]


def makespan(final: Sequence[Task], started: float) -> float:
    return max(t.finished_at or float("nan") for t in final) - started


def turnaround(tasks: Sequence[Task]) -> float:
    """Mean time from submit to terminal."""
    return statistics.fmean((t.finished_at or float("nan")) - t.created_at for t in tasks)


def queue_wait(tasks: Sequence[Task]) -> float:
    """Mean time from submit to the first start."""
    return statistics.fmean((t.started_at or float("nan")) - t.created_at for t in tasks)


def provider_figures(sim: RunningSimulator) -> Figures:
    stats = sim.state.stats
    ledger = sim.state.ledger.as_dict()
    return {
        "requests": stats.requests,
        "rate_limited_429": stats.rate_limited,
        "errors_5xx": stats.errors_5xx,
        "peak_concurrency": stats.peak_concurrency,
        "charged": ledger["total"],
        "double_charged": len(ledger["double_charged"]),
    }


def task_figures(final: Sequence[Task]) -> Figures:
    return {
        "tasks": len(final),
        "lost": sum(not t.terminal for t in final),
        "failed": sum(t.terminal and t.status is not Status.SUCCEEDED for t in final),
        "retries": sum(max(0, t.attempts - 1) for t in final),
    }


@dataclass(frozen=True)
class Summary:
    """How a scenario's runs become its reported figures."""

    headline: tuple[str, ...]  # medians over runs
    worst: tuple[str, ...] = ()  # counts that must hold in every run: the largest is reported

    def of(self, runs: Sequence[Figures]) -> Figures:
        out: Figures = {}
        for key in self.headline:
            out[key] = _median(r[key] for r in runs)
        for key in self.worst:
            out[key] = max(r[key] for r in runs)
        return out


def _median(values: Iterable[Any]) -> Any:
    items = list(values)
    if all(isinstance(v, bool) for v in items):
        return all(items)
    return statistics.median(items)


def rounded(figures: Figures, digits: int = 4) -> Figures:
    return {k: round(v, digits) if isinstance(v, float) else v for k, v in figures.items()}


Check = Callable[[Figures], bool]


# ==========================================================================================
# Scenarios
# ==========================================================================================
FIRST_SEED = 1
#: in-process worker slots: more than any provider cap here, so the resource is what limits
WORKER_SLOTS = 20


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    floor: str
    run: Callable[[int, bool], Coroutine[Any, Any, Figures]]  # (seed, quick) -> one run
    summary: Summary
    check: Check
    slow: bool = False  # at least a minute whatever the size: left out of --quick sweeps
    #: another queue's run of the same scenario and seed (``--peers``), its figures prefixed
    peer: Callable[[int, bool], Coroutine[Any, Any, Figures]] | None = None


# -- Q1: a concurrency cap -----------------------------------------------------------------
async def q1_run(seed: int, quick: bool) -> Figures:
    """200 tasks against a provider capped at 10 concurrent requests, 5 % 5xx."""
    n, latency_ms = (40, 100.0) if quick else (q1app.TASKS, q1app.LATENCY_MS)
    sim_config = q1app.simulator(seed, latency_ms)
    async with simulator(sim_config) as sim, scratch_database() as db:
        async with runtime(q1app.settings(sim.url, db)) as fw:
            tasks = await fw.submit_many(KIND, inputs(n, f"q1-{seed}"))
            started = time.time()
            async with fw.worker(q1app.WORKER_CONCURRENCY):
                await until_terminal(fw, n, timeout_s=60 + 10 * n * latency_ms / 1000)
            final = await reread(fw, tasks)
        provider = provider_figures(sim)
    span = makespan(final, started)
    optimum = sim.state.stats.busy_s / q1app.CAP
    return {
        **task_figures(final),
        **provider,
        "makespan_s": span,
        "provider_busy_s": sim.state.stats.busy_s,
        "optimum_s": optimum,
        "nominal_optimum_s": n * latency_ms / 1000 / q1app.CAP,
        "makespan_over_optimum": span / optimum,
    }


def q1_check(f: Figures) -> bool:
    clean = f["rate_limited_429"] == 0 and f["failed"] == 0 and f["lost"] == 0
    return bool(f["makespan_over_optimum"] <= 1.10 and clean and f["double_charged"] == 0)


# -- Q2 and Q4: a requests-per-minute limit --------------------------------------------------
@dataclass(frozen=True)
class RateCase:
    tasks: int
    rpm: int
    latency_ms: float = 50.0


def rate_case(quick: bool) -> RateCase:
    # Quick: the same 300 tasks at ten times the rate, so the same share of a minute.
    return RateCase(300, 6000 if quick else 600)


#: Q2's headroom. 1.0 is the only setting that can reach the floor: floodway refills at
#: headroom x the limit, so 0.9 alone would cost 1/0.9 = 1.11x. It sends no 429 here because
#: the default burst at 1.0 is one second of refill (B = R/60), and N (300) + B stays within
#: the provider's sliding minute (R = 600).
Q2_HEADROOM = 1.0


def rate_optimum(case: RateCase) -> tuple[float, float]:
    """(initial burst B, optimum seconds) for the provider's limit (see the module doc)."""
    yardstick = ResourcePlan.build(
        "yardstick", ResourceConfig(requests_per_minute=case.rpm, headroom=1.0)
    )
    assert yardstick.requests is not None
    burst = yardstick.requests.capacity
    return burst, (case.tasks - burst) / (case.rpm / 60) + case.latency_ms / 1000


async def rate_run(
    seed: int, case: RateCase, resource: ResourceConfig, *, bucket: int = 0
) -> Figures:
    """``bucket``: the provider enforces its rpm as a token bucket of this capacity, with exact
    Retry-After(-Ms) and no rate-limit headers (0: a sliding minute, headers published)."""
    sim_config = SimulatorConfig(
        latency_ms=case.latency_ms,
        latency_jitter=0.2,
        rpm=case.rpm,
        rpm_burst=bucket,
        rate_headers=not bucket,
        seed=seed,
    )
    burst, optimum = rate_optimum(case)
    async with simulator(sim_config) as sim, scratch_database() as db:
        async with runtime(provider_settings(sim.url, db, resource)) as fw:
            tasks = await fw.submit_many(KIND, inputs(case.tasks, f"rate-{seed}"))
            started = time.time()
            async with fw.worker(WORKER_SLOTS):
                await until_terminal(fw, case.tasks, timeout_s=60 + 4 * optimum)
            final = await reread(fw, tasks)
        provider = provider_figures(sim)
    span = makespan(final, started)
    return {
        **task_figures(final),
        **provider,
        "makespan_s": span,
        "initial_burst": burst,
        "optimum_s": optimum,
        "makespan_over_optimum": span / optimum,
        "share_429": provider["rate_limited_429"] / max(1, provider["requests"]),
    }


async def q2_run(seed: int, quick: bool) -> Figures:
    case = rate_case(quick)
    resource = ResourceConfig(requests_per_minute=case.rpm, headroom=Q2_HEADROOM)
    return {**await rate_run(seed, case, resource), "headroom": Q2_HEADROOM}


async def q4_run(seed: int, quick: bool) -> Figures:
    # No rate at all: only what 429s and their Retry-After teach (adaptive).
    return await rate_run(seed, rate_case(quick), ResourceConfig(adaptive=True))


async def q4b_run(seed: int, quick: bool) -> Figures:
    """Q4 with twice a minute's worth of tasks, so the provider's sliding minute binds (in Q4
    300 tasks fit in one minute of a 600/min window: no 429 can ever happen). The simulator's
    window is 60 s whatever the size, so there is no quick variant."""
    case = RateCase(tasks=600, rpm=300)
    figures = await rate_run(seed, case, ResourceConfig(adaptive=True))
    # What a sliding window really allows: a minute's worth at once, the rest a minute later.
    window = (math.ceil(case.tasks / case.rpm) - 1) * 60.0 + case.latency_ms / 1000
    return {
        **figures,
        "window_optimum_s": window,
        "makespan_over_window_optimum": figures["makespan_s"] / window,
    }


async def q2b_run(seed: int, quick: bool) -> Figures:
    """Q2 against a provider that enforces its rate as an exact token bucket of a second's
    refill (Q6's provider), the same figure configured at headroom 1.0: no margin at all."""
    case = rate_case(quick)
    resource = ResourceConfig(requests_per_minute=case.rpm, headroom=Q2_HEADROOM)
    bucket = Q6_BUCKET * (10 if quick else 1)
    figures = await rate_run(seed, case, resource, bucket=bucket)
    return {**figures, "headroom": Q2_HEADROOM, "provider_bucket": bucket}


def q2_check(f: Figures) -> bool:
    return bool(f["makespan_over_optimum"] <= 1.05 and f["rate_limited_429"] == 0)


def q4_check(f: Figures) -> bool:
    return bool(f["makespan_over_optimum"] <= 1.30 and f["share_429"] < 0.05)


# -- Q6: a rate nobody told floodway ---------------------------------------------------------
#: the provider's bucket: a second of its 600/min, as the yardstick's B in rate_optimum
Q6_BUCKET = 10


async def q6_run(seed: int, quick: bool) -> Figures:
    case = rate_case(quick)
    bucket = Q6_BUCKET * (10 if quick else 1)
    figures = await rate_run(seed, case, ResourceConfig(adaptive=True), bucket=bucket)
    return {**figures, "provider_bucket": bucket}


def q6_check(f: Figures) -> bool:
    return bool(f["makespan_over_optimum"] <= 1.15 and f["share_429"] < 0.02)


# -- Q7: a concurrency cap nobody told floodway -----------------------------------------------
async def cap_run(seed: int, quick: bool, resource: ResourceConfig, spontaneous: float) -> Figures:
    """Q1's provider and load; ``resource`` as configured, ``spontaneous`` 429s."""
    n, latency_ms = (40, 100.0) if quick else (q1app.TASKS, q1app.LATENCY_MS)
    sim_config = q1app.simulator(seed, latency_ms).model_copy(
        update={"rate_limit_rate": spontaneous}
    )
    async with simulator(sim_config) as sim, scratch_database() as db:
        async with runtime(provider_settings(sim.url, db, resource)) as fw:
            tasks = await fw.submit_many(KIND, inputs(n, f"cap-{seed}"))
            started = time.time()
            async with fw.worker(q1app.WORKER_CONCURRENCY):
                await until_terminal(fw, n, timeout_s=60 + 10 * n * latency_ms / 1000)
            final = await reread(fw, tasks)
            snap = await resource_snapshot(fw)
        provider = provider_figures(sim)
    span = makespan(final, started)
    optimum = sim.state.stats.busy_s / q1app.CAP
    return {
        **task_figures(final),
        **provider,
        "makespan_s": span,
        "optimum_s": optimum,
        "makespan_over_optimum": span / optimum,
        "share_429": provider["rate_limited_429"] / max(1, provider["requests"]),
        **snap,
    }


async def resource_snapshot(fw: Floodway) -> Figures:
    """What floodway ended up believing of the resource, and its 429s split."""
    admission = fw.runtime.admission
    assert isinstance(admission, LimitsAdmission)
    snap = (await admission.snapshot())[RESOURCE]
    cap = snap.limits.get("concurrency")
    return {
        "learned_concurrency": None if cap is None else cap.value,
        "concurrency_source": None if cap is None else cap.source,
        "throttles_limit": snap.throttles_limit,
        "throttles_noise": snap.throttles_noise,
        "pauses": snap.pauses,
    }


async def q7_run(seed: int, quick: bool) -> Figures:
    return await cap_run(seed, quick, ResourceConfig(adaptive=True), 0.0)


def q7_check(f: Figures) -> bool:
    return bool(f["makespan_over_optimum"] <= 1.20 and f["share_429"] < 0.05)


# -- Q8: spontaneous 429s at a configured limit ------------------------------------------------
Q8_SPONTANEOUS = 0.02


async def q8_run(seed: int, quick: bool) -> Figures:
    """Q1 (its limit configured, ``adaptive`` on) with and without spontaneous 429s."""
    resource = ResourceConfig(concurrency=q1app.CAP, headroom=1.0, adaptive=True)
    clean = await cap_run(seed, quick, resource, 0.0)
    noisy = await cap_run(seed, quick, resource, Q8_SPONTANEOUS)
    return {
        "noisy_over_clean": noisy["makespan_s"] / clean["makespan_s"],
        "makespan_s": noisy["makespan_s"],
        "clean_makespan_s": clean["makespan_s"],
        "makespan_over_optimum": noisy["makespan_over_optimum"],
        "clean_makespan_over_optimum": clean["makespan_over_optimum"],
        "rate_limited_429": noisy["rate_limited_429"],
        "throttles_noise": noisy["throttles_noise"],
        "throttles_limit": noisy["throttles_limit"],
        "pauses": noisy["pauses"],
        "learned_concurrency": noisy["learned_concurrency"],
        "failed": noisy["failed"] + clean["failed"],
        "lost": noisy["lost"] + clean["lost"],
        "double_charged": noisy["double_charged"] + clean["double_charged"],
    }


def q8_check(f: Figures) -> bool:
    return bool(f["noisy_over_clean"] <= 1.05)


# -- Q3: a tokens-per-minute bucket, one large task ahead of small ones ----------------------
BIG_TOKENS = 30_000
SMALL_TOKENS = 1_000
SMALL_TASKS = 30
#: spent just before the batch, so the big task can be admitted only after a refill
PRIMING_TOKENS = 20_000
#: every task counts as aged at once: submit order, and a refused head reserves the bucket
FIFO_TUNING = AdmissionTuning(aging_s=1e-6)


@dataclass(frozen=True)
class TokenCase:
    tpm: float  # both the limit and, with burst_s, a bucket holding exactly the big task
    burst_s: float
    latency_ms: float


def token_case(quick: bool) -> TokenCase:
    if quick:
        return TokenCase(tpm=1_200_000, burst_s=1.5, latency_ms=50.0)
    return TokenCase(tpm=60_000, burst_s=30.0, latency_ms=100.0)


def fifo_prediction(case: TokenCase, level: float) -> float:
    """Small tasks' mean turnaround under strict FIFO, from the bucket math: the big task waits
    for the refill to 30k, then small i waits for i x 1k more."""
    rate = case.tpm / 60
    big_at = max(0.0, (BIG_TOKENS - level) / rate)
    return big_at + (SMALL_TASKS + 1) / 2 * SMALL_TOKENS / rate + case.latency_ms / 1000


async def token_level(fw: Floodway) -> float:
    admission = fw.runtime.admission
    assert isinstance(admission, LimitsAdmission)
    tokens = (await admission.snapshot())[RESOURCE].tokens
    assert tokens is not None
    return tokens.level


async def token_run(seed: int, case: TokenCase, fifo: bool) -> Figures:
    """The priming task, then the big one, then thirty small ones; all in one tenant."""
    resource = ResourceConfig(tokens_per_minute=case.tpm, headroom=1.0, burst=case.burst_s)
    # The provider does not meter tokens itself (tpm=0): floodway's bucket is the limit, so
    # the runs compare orderings, not the simulator's sliding window against the bucket.
    sim_config = SimulatorConfig(latency_ms=case.latency_ms, latency_jitter=0.2, seed=seed)
    async with simulator(sim_config) as sim, scratch_database() as db:
        settings = provider_settings(sim.url, db, resource, cost="tokens")
        async with runtime(settings, FIFO_TUNING if fifo else None) as fw:
            async with fw.worker(SMALL_TASKS + 10):
                prime = await fw.submit(KIND, {"tag": f"prime-{seed}", "tokens": PRIMING_TOKENS})
                await fw.wait(prime.id, timeout=60)
                level = await token_level(fw)
                big = await fw.submit(KIND, {"tag": f"big-{seed}", "tokens": BIG_TOKENS})
                smalls = await fw.submit_many(
                    KIND, inputs(SMALL_TASKS, f"small-{seed}", tokens=SMALL_TOKENS)
                )
                await until_terminal(fw, SMALL_TASKS + 2, timeout_s=60 + 3 * 60 * 60_000 / case.tpm)
            big_final, *small_final = await reread(fw, [big, *smalls])
        provider = provider_figures(sim)
    return {
        **task_figures([big_final, *small_final]),
        **provider,
        "level_at_submit": level,
        "small_mean_s": turnaround(small_final),
        "big_s": turnaround([big_final]),
        "big_succeeded": big_final.status is Status.SUCCEEDED,
        "fifo_predicted_small_mean_s": fifo_prediction(case, level),
    }


async def q3_run(seed: int, quick: bool) -> Figures:
    case = token_case(quick)
    ours = await token_run(seed, case, fifo=False)
    fifo = await token_run(seed, case, fifo=True)
    return {
        "small_mean_s": ours["small_mean_s"],
        "small_mean_fifo_s": fifo["small_mean_s"],
        "small_over_fifo": ours["small_mean_s"] / fifo["small_mean_s"],
        "fifo_predicted_small_mean_s": fifo["fifo_predicted_small_mean_s"],
        "big_s": ours["big_s"],
        "big_fifo_s": fifo["big_s"],
        "big_finished": ours["big_succeeded"] and fifo["big_succeeded"],
        "failed": ours["failed"] + fifo["failed"],
        "lost": ours["lost"] + fifo["lost"],
        "rate_limited_429": ours["rate_limited_429"] + fifo["rate_limited_429"],
        "double_charged": ours["double_charged"] + fifo["double_charged"],
    }


def q3_check(f: Figures) -> bool:
    return bool(f["small_over_fifo"] <= 0.5 and f["big_finished"])


# -- Q5: tenant fairness ------------------------------------------------------------------------
TENANT_CAP = 10


@dataclass(frozen=True)
class TenantCase:
    a_tasks: int
    b_tasks: int
    latency_ms: float
    b_after_s: float  # B submits this long after A, into A's backlog


def tenant_case(quick: bool) -> TenantCase:
    if quick:
        return TenantCase(a_tasks=100, b_tasks=10, latency_ms=50.0, b_after_s=0.5)
    return TenantCase(a_tasks=500, b_tasks=10, latency_ms=200.0, b_after_s=2.0)


async def tenant_run(seed: int, case: TenantCase, with_a: bool) -> Figures:
    sim_config = SimulatorConfig(
        latency_ms=case.latency_ms, latency_jitter=0.2, max_concurrency=TENANT_CAP, seed=seed
    )
    resource = ResourceConfig(concurrency=TENANT_CAP)
    async with simulator(sim_config) as sim, scratch_database() as db:
        async with runtime(provider_settings(sim.url, db, resource)) as fw:
            async with fw.worker(WORKER_SLOTS):
                if with_a:
                    await fw.submit_many(KIND, inputs(case.a_tasks, f"a-{seed}"), tenant="A")
                    await asyncio.sleep(case.b_after_s)
                b = await fw.submit_many(KIND, inputs(case.b_tasks, f"b-{seed}"), tenant="B")
                for task in b:
                    await fw.wait(task.id, timeout=120)
                # Leaving the block stops the worker: A's backlog is not needed any more.
            b_final = await reread(fw, b)
        provider = provider_figures(sim)
    return {
        **task_figures(b_final),
        "rate_limited_429": provider["rate_limited_429"],
        "b_mean_s": turnaround(b_final),
        "b_wait_s": queue_wait(b_final),
    }


async def q5_run(seed: int, quick: bool) -> Figures:
    case = tenant_case(quick)
    behind_a = await tenant_run(seed, case, with_a=True)
    alone = await tenant_run(seed, case, with_a=False)
    service = case.latency_ms / 1000
    return {
        "b_mean_s": behind_a["b_mean_s"],
        "b_alone_mean_s": alone["b_mean_s"],
        "service_s": service,
        "allowance_s": alone["b_mean_s"] + service,
        "excess_over_alone_s": behind_a["b_mean_s"] - alone["b_mean_s"],
        "b_wait_s": behind_a["b_wait_s"],
        "b_alone_wait_s": alone["b_wait_s"],
        "failed": behind_a["failed"] + alone["failed"],
        "rate_limited_429": behind_a["rate_limited_429"] + alone["rate_limited_429"],
    }


def q5_check(f: Figures) -> bool:
    return bool(f["b_mean_s"] <= f["allowance_s"])


SCENARIOS: dict[str, Scenario] = {
    s.id: s
    for s in (
        Scenario(
            "Q1",
            "200 tasks, provider cap 10 concurrent, 500 ms +-20 %, 5 % 5xx",
            "makespan/optimum <= 1.10; 429s 0; failed 0; double charges 0",
            q1_run,
            Summary(
                (
                    "makespan_over_optimum",
                    "makespan_s",
                    "optimum_s",
                    "nominal_optimum_s",
                    "errors_5xx",
                    "retries",
                    "peak_concurrency",
                    "requests",
                ),
                ("rate_limited_429", "failed", "lost", "double_charged"),
            ),
            q1_check,
            peer=peer_q1.dramatiq_run,
        ),
        Scenario(
            "Q2",
            "300 tasks of 50 ms, provider 600 requests/min, resource rpm 600 at headroom 1.0",
            "makespan/optimum <= 1.05; 429s 0",
            q2_run,
            Summary(
                (
                    "makespan_over_optimum",
                    "makespan_s",
                    "optimum_s",
                    "initial_burst",
                    "headroom",
                    "requests",
                ),
                ("rate_limited_429", "failed", "lost", "double_charged"),
            ),
            q2_check,
        ),
        Scenario(
            "Q2b",
            "as Q2, the provider enforcing its 600/min as an exact token bucket of 10 (Q6's)",
            "makespan/optimum <= 1.05; 429s 0 (Q2's floors)",
            q2b_run,
            Summary(
                (
                    "makespan_over_optimum",
                    "makespan_s",
                    "optimum_s",
                    "initial_burst",
                    "provider_bucket",
                    "requests",
                ),
                ("rate_limited_429", "failed", "lost", "double_charged"),
            ),
            q2_check,
        ),
        Scenario(
            "Q3",
            "one 30k-token task, then thirty 1k-token tasks, tokens/min bucket (vs strict FIFO)",
            "small tasks' mean completion <= 0.5x FIFO; big task finishes",
            q3_run,
            Summary(
                (
                    "small_over_fifo",
                    "small_mean_s",
                    "small_mean_fifo_s",
                    "fifo_predicted_small_mean_s",
                    "big_s",
                    "big_fifo_s",
                    "big_finished",
                ),
                ("failed", "lost", "rate_limited_429", "double_charged"),
            ),
            q3_check,
        ),
        Scenario(
            "Q4",
            "as Q2, the resource configured with no rate (adaptive only)",
            "makespan/optimum <= 1.30; 429s < 5 % of requests",
            q4_run,
            Summary(
                ("makespan_over_optimum", "makespan_s", "optimum_s", "share_429", "requests"),
                ("rate_limited_429", "failed", "lost", "double_charged"),
            ),
            q4_check,
        ),
        Scenario(
            "Q4b",
            "as Q4 with 600 tasks at 300/min, so the provider's sliding minute binds",
            "makespan/optimum <= 1.30; 429s < 5 % of requests (Q4's floors)",
            q4b_run,
            Summary(
                (
                    "makespan_over_optimum",
                    "makespan_s",
                    "optimum_s",
                    "window_optimum_s",
                    "makespan_over_window_optimum",
                    "share_429",
                    "requests",
                ),
                ("rate_limited_429", "failed", "lost", "double_charged"),
            ),
            q4_check,
            slow=True,
        ),
        Scenario(
            "Q5",
            "tenant A submits 500, then tenant B 10; cap 10, 200 ms",
            "B's mean completion <= B alone + one service time",
            q5_run,
            Summary(
                (
                    "b_mean_s",
                    "b_alone_mean_s",
                    "allowance_s",
                    "excess_over_alone_s",
                    "service_s",
                    "b_wait_s",
                    "b_alone_wait_s",
                ),
                ("failed", "rate_limited_429"),
            ),
            q5_check,
        ),
        Scenario(
            "Q6",
            "300 tasks of 50 ms, provider 600/min as a token bucket of 10 with exact Retry-After "
            "and no rate-limit headers; the resource configured with adaptive only",
            "makespan/optimum <= 1.15; 429s < 2 % of requests",
            q6_run,
            Summary(
                ("makespan_over_optimum", "share_429", "makespan_s", "optimum_s", "requests"),
                ("rate_limited_429", "failed", "lost", "double_charged"),
            ),
            q6_check,
        ),
        Scenario(
            "Q7",
            "200 calls of 500 ms +-20 %, provider cap 10 in flight (429 beyond), 5 % 5xx; the "
            "resource configured with adaptive only",
            "makespan/optimum <= 1.20; 429s < 5 % of requests",
            q7_run,
            Summary(
                (
                    "makespan_over_optimum",
                    "share_429",
                    "learned_concurrency",
                    "makespan_s",
                    "optimum_s",
                    "requests",
                    "throttles_limit",
                    "throttles_noise",
                    "pauses",
                ),
                ("failed", "lost", "double_charged"),
            ),
            q7_check,
        ),
        Scenario(
            "Q8",
            "Q1 with 2 % spontaneous 429s, its cap configured and adaptive on, against the same "
            "seed without them",
            "makespan within 5 % of the run without spontaneous 429s",
            q8_run,
            Summary(
                (
                    "noisy_over_clean",
                    "makespan_over_optimum",
                    "clean_makespan_over_optimum",
                    "rate_limited_429",
                    "throttles_noise",
                    "throttles_limit",
                    "pauses",
                    "learned_concurrency",
                ),
                ("failed", "lost", "double_charged"),
            ),
            q8_check,
        ),
    )
}


#: the optimum of each scenario, recorded with its figures
DEFINITIONS = (__doc__ or "").partition("The optimum is")[2].strip()


# ==========================================================================================
# Running and recording
# ==========================================================================================
#: the peer's figures in a scenario's summary (medians; the counts that must be zero and the
#: peak: the worst run), the first ones shown in the results table
PEER = "dramatiq"
PEER_SUMMARY = Summary(
    (
        f"{PEER}_makespan_over_optimum",
        f"{PEER}_makespan_s",
        f"{PEER}_requests",
        f"{PEER}_refused_by_limiter",
    ),
    (
        f"{PEER}_rate_limited_429",
        f"{PEER}_peak_concurrency",
        f"{PEER}_failed",
        f"{PEER}_double_charged",
    ),
)


def run_scenario(
    scenario: Scenario,
    runs: int,
    quick: bool,
    *,
    prefix: str = "quota",
    definitions: str | None = None,
    record: bool = True,
    peers: bool = False,
) -> Figures:
    """Run ``scenario`` ``runs`` times (each in a fresh event loop), print each run, and
    write the summary to bench/results/<prefix>-<ID>[-quick].json. ``peers``: each run is
    followed by the scenario's peer on the same seed, so both see the machine alike."""
    peer = scenario.peer if peers else None
    results: list[Figures] = []
    for i in range(runs):
        figures = asyncio.run(scenario.run(FIRST_SEED + i, quick))
        if peer is not None:
            theirs = asyncio.run(peer(FIRST_SEED + i, quick))
            figures |= {f"{PEER}_{k}": v for k, v in theirs.items()}
        results.append(figures)
        print(f"{scenario.id} run {i + 1}: {describe(rounded(figures, 3))}", flush=True)
    summary = rounded(scenario.summary.of(results))
    shown = [*scenario.summary.headline[:4], *scenario.summary.worst]
    if peer is not None:
        summary |= rounded(PEER_SUMMARY.of(results))
        shown += [PEER_SUMMARY.headline[0], *PEER_SUMMARY.worst[:2]]
    outcome: Figures = {
        "id": scenario.id,
        "scenario": scenario.title + (" (quick size)" if quick else ""),
        "quick": quick,
        "floor": scenario.floor,
        "passed": scenario.check(summary),
        "figures": summary,
        # what the results table shows: the leading medians and the must-be-zero counts
        "shown": shown,
        "runs": [rounded(r) for r in results],
        "definitions": DEFINITIONS if definitions is None else definitions,
    }
    if record:
        path = write_result(result_name(prefix, scenario.id, quick), outcome)
        print(
            f"{scenario.id}: {'PASS' if outcome['passed'] else 'MISS'} "
            f"{describe(summary)} -> {path}",
            flush=True,
        )
    return outcome


def result_name(prefix: str, scenario_id: str, quick: bool) -> str:
    return f"{prefix}-{scenario_id}" + ("-quick" if quick else "")


def describe(figures: Figures) -> str:
    return ", ".join(f"{k} {v}" for k, v in figures.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("ids", nargs="*", metavar="ID", help=f"of {', '.join(SCENARIOS)}")
    parser.add_argument("--runs", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smaller, faster sizes")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="after each run, the same scenario and seed run by another queue (Q1: Dramatiq)",
    )
    args = parser.parse_args()
    by_upper = {k.upper(): k for k in SCENARIOS}
    ids = [by_upper.get(i.upper(), i) for i in args.ids] or [
        s.id for s in SCENARIOS.values() if not (args.quick and s.slow)
    ]
    unknown = [i for i in ids if i not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    runs = args.runs or (1 if args.quick else 3)
    for scenario_id in ids:
        run_scenario(SCENARIOS[scenario_id], runs, args.quick, peers=args.peers)


if __name__ == "__main__":
    main()
