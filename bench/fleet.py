"""F1 and F2: Q1 on a fleet -- four `floodway worker` processes and one `floodway api`, one
PostgreSQL, one Redis; and Q6 and Q7 on the same fleet (limits it must learn).

    python -m bench.fleet                       # F1, F2-kill, F2-redis, Q6 and Q7, 5 runs each
    python -m bench.fleet --scenario F1 --runs 5
    python -m bench.fleet --database postgresql://postgres@127.0.0.1/test

Q1's load: 200 tasks against the simulated provider, which serves at most 10 requests at once
(429 beyond), answers in 500 ms +-20 % and fails 5 % with a 503. Every worker process enforces
the resource ``sim`` (concurrency 10) through the shared Redis limiter.

* **F1**: the run as is. Figures: the provider's peak concurrency, its 429s, and makespan /
  optimum.
* **F2-kill**: F1 with the worker holding the most tasks SIGKILLed 3 s in (not restarted; the
  other three finish its work once its leases expire).
* **F2-redis**: F1 with Redis stopped 3 s in (``shutdown nosave``: its state is gone) and
  started again 5 s later. Dispatch must pause (fail closed) and resume by itself.

F2 figures: tasks lost (not terminal at the end), charged twice (the provider's ledger) and
whether a limit was exceeded (a 429, or more than 10 in flight at the provider).

* **Q6** (fleet): bench/quota.py's Q6 on the fleet: 300 tasks of 50 ms, the provider enforcing
  600/min as a token bucket of 10 (exact Retry-After, no rate-limit headers); the resource is
  configured ``adaptive`` only, so the four processes learn one rate through Redis. Optimum
  as Q6's: (300 - 10) / 10 per s + 50 ms.
* **Q7** (fleet): F1's provider (cap 10, 429 beyond) with the resource configured ``adaptive``
  only: the fleet learns one in-flight cap. Optimum as F1's.

Definitions. The clock starts when the 200 tasks are submitted (one ``POST /v1/batches`` to
the API process), the processes already up (their start-up is not the scheduler's work); the
makespan ends when the ledger shows every task terminal. The optimum is what the cap allows
for the work the provider really did: the sum of its request durations (failed ones included)
/ 10. ``idle_s`` splits the excess: before the first requests (submit and first dispatch),
between requests (hand-offs, and retries waiting out their backoff) and after each slot's last
response (the last requests finishing at different times).

Each run gets a fresh PostgreSQL database (created on the server of --database, dropped after)
and a private ``redis-server`` on a free port: F2-redis stops only that one. Writes
bench/results/fleet-F1.json, fleet-F2-kill.json and fleet-F2-redis.json (medians of the runs).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.common import median, percentile, write_result
from floodway import Floodway, Status, Task
from floodway.core.states import TERMINAL
from floodway.limits.admission import LimitsAdmission
from floodway.providers.sim import SimulatorConfig, SimulatorState, running_simulator
from floodway.providers.sim.model import Fate, Job
from floodway.providers.sim.state import Decision
from floodway.store.base import TaskQuery
from harness.fleet import (
    KIND,
    PG_URL,
    RESOURCE,
    ApiProcess,
    RedisServer,
    WorkerProcess,
    build,
    fresh_database,
    private_redis,
    spawn_api,
    spawn_worker,
)
from harness.processes import until

CAP = 10
CLAIM_FAILED = "dispatch paused"  # what a worker logs while the limiter is out of reach
SCENARIOS = ("F1", "F2-kill", "F2-redis", "Q6", "Q7")
#: the scenarios whose resource is configured adaptive only (nothing else)
LEARNING = ("Q6", "Q7")
Q6_TASKS, Q6_LATENCY_MS, Q6_RPM, Q6_BUCKET = 300, 50.0, 600, 10


@dataclass
class Options:
    database: str
    tasks: int
    workers: int
    concurrency: int
    lease: str
    latency_ms: float
    error_rate: float
    fault_at_s: float
    outage_s: float
    timeout_s: float


@dataclass
class ProviderClock:
    """When each request started and ended at the provider (instrumentation of this bench)."""

    started: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)

    def attach(self, state: SimulatorState) -> None:
        submit, finish = state.submit, state.finish

        def timed_submit(sub: Any, now: float) -> Decision:
            decision = submit(sub, now)
            job = getattr(decision, "job", None)
            if job is not None and job.id not in self.started and job.status == "running":
                self.started[job.id] = time.monotonic()
            return decision

        def timed_finish(job: Job, outcome: Fate) -> None:
            if job.id in self.started and job.id not in self.ended:
                self.ended[job.id] = time.monotonic()
            finish(job, outcome)

        state.submit = timed_submit  # type: ignore[method-assign]
        state.finish = timed_finish  # type: ignore[method-assign]

    def busy_s(self) -> float:
        return sum(self.ended[j] - self.started[j] for j in self.ended)

    def handoffs_ms(self, cap: int) -> list[float]:
        """How long a freed provider slot stayed idle while work was queued: the k-th request
        after the first ``cap`` took the slot the (k - cap)-th response freed."""
        starts = sorted(self.started.values())[cap:]
        ends = sorted(self.ended.values())
        return [(s - e) * 1000 for s, e in zip(starts, ends, strict=False)]

    def idle_s(self, cap: int, t0: float) -> dict[str, float]:
        """Where the makespan's excess over the optimum went, in seconds of the makespan (slot
        idle time / cap): before the first ``cap`` requests, between requests (hand-offs, and
        retries waiting out their backoff), and after each slot's last response while the last
        requests finish. The three add up to the last response's time less the optimum."""
        starts, ends = sorted(self.started.values()), sorted(self.ended.values())
        if len(ends) < cap:
            return {}
        last = ends[-1]
        before = sum(s - t0 for s in starts[:cap])
        after = sum(last - e for e in ends[-cap:])
        between = cap * (last - t0) - self.busy_s() - before - after
        return {
            "before_first_requests": round(before / cap, 3),
            "between_requests": round(between / cap, 3),
            "after_last_requests": round(after / cap, 3),
        }


@dataclass
class Fault:
    """What the fault injector did and saw."""

    notes: dict[str, Any] = field(default_factory=dict)


async def kill_busiest(fw: Floodway, workers: list[WorkerProcess], fault: Fault) -> None:
    running = await fw.list_tasks(TaskQuery(status=Status.RUNNING, limit=200))
    held = Counter(w.pid for w in workers for t in running if w.owns(t.lease_owner))
    victim = max(workers, key=lambda w: held.get(w.pid, 0))
    victim.kill()
    fault.notes.update(killed_pid=victim.pid, tasks_held_by_killed=held.get(victim.pid, 0))


async def redis_outage(
    redis: RedisServer, state: SimulatorState, workers: list[WorkerProcess], seconds: float
) -> dict[str, Any]:
    """Stop Redis for ``seconds``; count the requests sent once the ones in flight at the stop
    had ended (fail closed: none) and the dispatchers' failed claims."""
    failed_before = sum(w.count(CLAIM_FAILED) for w in workers)
    stopped = time.monotonic()
    wall_from = time.time()
    redis.stop()
    notes: dict[str, Any] = {"in_flight_at_stop": state.stats.in_flight}
    try:
        while state.stats.in_flight and time.monotonic() - stopped < seconds:
            await asyncio.sleep(0.01)
        drained = state.stats.in_flight == 0
        requests_drained = state.stats.requests
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - stopped)))
        notes["requests_while_down"] = state.stats.requests - requests_drained if drained else None
    finally:
        notes["wall_from"], notes["wall_until"] = wall_from, time.time()
        await redis.start()
    notes["outage_s"] = round(time.monotonic() - stopped, 3)
    notes["failed_claims_logged"] = sum(w.count(CLAIM_FAILED) for w in workers) - failed_before
    return notes


async def claims_between(fw: Floodway, tasks: list[Task], start: float, end: float) -> int:
    count = 0
    for t in tasks:
        for e in await fw.store.events(t.id):
            count += e.status is Status.RUNNING and start <= e.at <= end
    return count


def simulator_config(scenario: str, opts: Options, seed: int) -> SimulatorConfig:
    if scenario == "Q6":
        return SimulatorConfig(
            latency_ms=Q6_LATENCY_MS,
            latency_jitter=0.2,
            rpm=Q6_RPM,
            rpm_burst=Q6_BUCKET,
            rate_headers=False,
            seed=seed,
        )
    return SimulatorConfig(
        latency_ms=opts.latency_ms,
        latency_jitter=0.2,
        max_concurrency=CAP,
        error_rate=opts.error_rate,
        seed=seed,
    )


async def one_run(scenario: str, opts: Options, seed: int) -> dict[str, Any]:
    config = simulator_config(scenario, opts, seed)
    adaptive = scenario in LEARNING
    if scenario == "Q6":
        opts = replace(opts, tasks=Q6_TASKS)
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            fresh_database(opts.database) as database,
            private_redis(Path(tmp) / "redis") as redis,
            running_simulator(config) as sim,
        ):
            provider = ProviderClock()
            provider.attach(sim.state)
            fw = build(database, sim.url, redis=redis.url, cap=CAP, adaptive=adaptive)
            async with fw:
                api = spawn_api(
                    database, redis.url, sim.url, Path(tmp) / "api.log", cap=CAP, adaptive=adaptive
                )
                workers = [
                    spawn_worker(
                        database,
                        redis.url,
                        sim.url,
                        Path(tmp) / f"worker{i}.log",
                        lease=opts.lease,
                        concurrency=opts.concurrency,
                        cap=CAP,
                        adaptive=adaptive,
                    )
                    for i in range(opts.workers)
                ]
                try:
                    return await _drive(
                        scenario, opts, fw, api, workers, redis, sim.state, provider
                    )
                finally:
                    for w in workers:
                        w.stop(30)
                    api.stop(30)


async def _drive(
    scenario: str,
    opts: Options,
    fw: Floodway,
    api: ApiProcess,
    workers: list[WorkerProcess],
    redis: RedisServer,
    state: SimulatorState,
    provider: ProviderClock,
) -> dict[str, Any]:
    async def ready() -> bool:
        return all(w.ready() for w in workers)

    await until(ready, 60, "every worker process started")
    await until(api.healthy, 60, "the API process answers")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = await api.submit_batch(KIND, [{"n": i} for i in range(opts.tasks)])
    submitted = loop.time() - t0
    fault = Fault()

    async def inject() -> None:
        await asyncio.sleep(max(0.0, opts.fault_at_s - (loop.time() - t0)))
        if scenario == "F2-kill":
            await kill_busiest(fw, workers, fault)
        elif scenario == "F2-redis":
            fault.notes.update(await redis_outage(redis, state, workers, opts.outage_s))

    injector = asyncio.create_task(inject())
    terminal = 0
    while loop.time() - t0 < opts.timeout_s:
        stats = await fw.store.stats()
        terminal = sum(stats.by_status[s.value] for s in TERMINAL)
        if terminal >= len(tasks) and injector.done():
            break
        await asyncio.sleep(0.02)
    makespan = loop.time() - t0
    await injector
    handoffs = provider.handoffs_ms(CAP)
    first_start = min(provider.started.values(), default=t0) - t0
    last_end = max(provider.ended.values(), default=t0) - t0
    final = [await fw.get(task_id) for task_id in tasks]
    states = Counter(t.status.value for t in final)
    busy = provider.busy_s()
    optimum = busy / CAP
    if scenario == "Q6":  # the rate's: (N - B) / R + one service time
        optimum = (opts.tasks - Q6_BUCKET) / (Q6_RPM / 60) + Q6_LATENCY_MS / 1000
    ledger = state.ledger.as_dict()
    figures: dict[str, Any] = {
        "makespan_s": round(makespan, 3),
        "optimum_s": round(optimum, 3),
        "makespan_over_optimum": round(makespan / optimum, 4) if optimum else None,
        "batch_accepted_after_s": round(submitted, 3),
        "first_request_after_s": round(first_start, 3),
        "last_response_after_s": round(last_end, 3),
        "slot_handoff_ms_p50": round(percentile(handoffs, 50), 1),
        "slot_handoff_ms_p90": round(percentile(handoffs, 90), 1),
        "idle_s": provider.idle_s(CAP, t0),
        "provider_peak_concurrency": state.stats.peak_concurrency,
        "provider_429s": state.stats.rate_limited,
        "provider_requests": state.stats.requests,
        "share_429": round(state.stats.rate_limited / max(1, state.stats.requests), 4),
        "provider_5xx": state.stats.errors_5xx,
        "statuses": dict(states),
        "lost": sum(1 for t in final if not t.terminal),
        "failed": sum(1 for t in final if t.terminal and t.status is not Status.SUCCEEDED),
        "charged_twice": len(ledger["double_charged"]),
        "charged": ledger["total"],
        "limit_exceeded": state.stats.peak_concurrency > CAP or state.stats.rate_limited > 0,
        "learned": await learned_limits(fw),
    }
    notes = dict(fault.notes)
    if scenario == "F2-redis" and "wall_from" in notes:
        notes["claims_while_down"] = await claims_between(
            fw, final, notes.pop("wall_from"), notes.pop("wall_until")
        )
    if notes:
        figures["fault"] = notes
    return figures


async def learned_limits(fw: Floodway) -> dict[str, Any]:
    """The limits in force at the end, as the fleet's shared estimates have them."""
    admission = fw.runtime.admission
    if not isinstance(admission, LimitsAdmission):
        return {}
    snap = (await admission.snapshot()).get(RESOURCE)
    if snap is None:
        return {}
    return {d: [round(lim.value, 2), lim.source] for d, lim in snap.limits.items()}


def summarize(scenario: str, opts: Options, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return median([float(r[key]) for r in runs if r[key] is not None])

    out: dict[str, Any] = {
        "scenario": scenario,
        "setup": {
            "backend": "postgresql + redis",
            "worker_processes": opts.workers,
            "worker_concurrency": opts.concurrency,
            "lease": opts.lease,
            "tasks": opts.tasks,
            "provider_cap": CAP,
            "latency_ms": opts.latency_ms,
            "latency_jitter": 0.2,
            "error_rate": opts.error_rate,
        },
        "makespan_over_optimum": med("makespan_over_optimum"),
        "makespan_s": med("makespan_s"),
        "batch_accepted_after_s": med("batch_accepted_after_s"),
        "first_request_after_s": med("first_request_after_s"),
        "slot_handoff_ms_p50": med("slot_handoff_ms_p50"),
        "slot_handoff_ms_p90": med("slot_handoff_ms_p90"),
        "optimum_s": med("optimum_s"),
        "idle_s": {
            part: median([r["idle_s"][part] for r in runs if r["idle_s"]])
            for part in ("before_first_requests", "between_requests", "after_last_requests")
            if any(r["idle_s"] for r in runs)
        },
        "provider_peak_concurrency": max(r["provider_peak_concurrency"] for r in runs),
        "provider_429s": sum(r["provider_429s"] for r in runs),
        "share_429": med("share_429"),
        "lost": sum(r["lost"] for r in runs),
        "charged_twice": sum(r["charged_twice"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
        "limit_exceeded": any(r["limit_exceeded"] for r in runs),
        "ratio_spread": [
            min(r["makespan_over_optimum"] for r in runs),
            max(r["makespan_over_optimum"] for r in runs),
        ],
        "runs": runs,
    }
    if scenario == "Q6":
        out["setup"].update(
            tasks=Q6_TASKS,
            latency_ms=Q6_LATENCY_MS,
            error_rate=0.0,
            provider_cap=None,
            provider_rate=f"{Q6_RPM}/min as a token bucket of {Q6_BUCKET}, no rate headers",
        )
    if scenario in LEARNING:
        out["setup"]["resource"] = "adaptive only (nothing configured)"
    if scenario == "F2-kill":
        out["setup"]["fault"] = f"busiest worker SIGKILLed at {opts.fault_at_s:g} s"
    elif scenario == "F2-redis":
        out["setup"]["fault"] = (
            f"Redis stopped (shutdown nosave) at {opts.fault_at_s:g} s for {opts.outage_s:g} s"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--database", default=PG_URL, help="server for the fresh databases")
    parser.add_argument(
        "--runs",
        type=int,
        default=5,
        help="per scenario (a 5xx in the last wave moves F1 by 5-15 %%)",
    )
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=10, help="per worker process")
    parser.add_argument("--lease", default="5s", help="worker lease (recovery after SIGKILL)")
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--error-rate", type=float, default=0.05)
    parser.add_argument("--fault-at", type=float, default=3.0, help="seconds into the run")
    parser.add_argument("--outage", type=float, default=5.0, help="Redis down, seconds")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up (count lost)")
    args = parser.parse_args()
    opts = Options(
        database=args.database,
        tasks=args.tasks,
        workers=args.workers,
        concurrency=args.concurrency,
        lease=args.lease,
        latency_ms=args.latency_ms,
        error_rate=args.error_rate,
        fault_at_s=args.fault_at,
        outage_s=args.outage,
        timeout_s=args.timeout,
    )
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    for scenario in scenarios:
        runs = []
        for i in range(args.runs):
            runs.append(asyncio.run(one_run(scenario, opts, seed=i + 1)))
            r = runs[-1]
            print(
                f"{scenario} run {i + 1}: makespan {r['makespan_s']:.2f} s = "
                f"{r['makespan_over_optimum']:.3f} x optimum, peak "
                f"{r['provider_peak_concurrency']}, 429s {r['provider_429s']}, lost {r['lost']}, "
                f"charged twice {r['charged_twice']}, failed {r['failed']}, idle {r['idle_s']}"
                + (f", fault {r['fault']}" if "fault" in r else "")
            )
        figures = summarize(scenario, opts, runs)
        path = write_result(f"fleet-{scenario}", figures)
        spread = statistics.pstdev([r["makespan_over_optimum"] for r in runs])
        print(
            f"{scenario} median {figures['makespan_over_optimum']:.3f} x optimum "
            f"(sd {spread:.3f}), peak {figures['provider_peak_concurrency']}, "
            f"429s {figures['provider_429s']}, lost {figures['lost']}, "
            f"charged twice {figures['charged_twice']} -> {path}"
        )


if __name__ == "__main__":
    main()
