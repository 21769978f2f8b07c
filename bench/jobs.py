"""J1-J2: multi-step jobs on the embedded default (SQLite, one process).

    python -m bench.jobs            # 3 runs each: bench/results/jobs.json
    python -m bench.jobs --quick    # smaller, 1 run: for smoke runs (jobs-quick.json)
    python -m bench.jobs --latency-scale 10   # J1 only, every call 10x longer (jobs-x10.json)

J1: 200 jobs of 5 steps submitted at once, a chain over three resources whose caps differ
(vision 4 at once, llm 2, speech 8) and whose work is sized so each resource has the same
optimum: its calls' summed latency / its cap (4 s each at full size). Figure: each resource's
makespan (its first call's start to its last call's end, as the handlers saw them) over that
optimum; floor: each within 10 % of it. Beside it, what a slot's hand-off costs: for each
call that ended while its resource was full, the time until the next call there started
(p50, p90): each is time the resource was not working. A hand-off costs milliseconds (a
listing, an admission and a claim, two of them hops to SQLite's threads), which the 20 ms llm
calls feel and calls of seconds do not: ``--latency-scale`` runs J1 with every call that many
times longer, to tell the order's part from the hand-offs'.

The optimum is a true lower bound for that makespan: the resource never runs more than its cap
at once, so the span of its calls is at least their summed time over the cap, and the work it
had to wait for before its first call (the chain ahead of it) is outside the span. It is not
loosened by that wait: a downstream resource is judged from its own first call. The whole run
is judged too, from the first submit to the last call's end, against the pipeline bound: for
each resource, the shortest chain of calls ahead of its first step, plus its work over its cap,
plus the shortest chain after its last step (the latencies asked for: a handler never sleeps
less), the largest over the resources.

J2: the added cost of a job over its steps submitted by hand, with room on every resource (caps
of 64, so steps do not queue behind limits): the same 200 chains of 5 as jobs and as caller
code that submits a step when the one before ended (``submit`` + ``wait``). Figures: submits
per second and CPU per submit (200 at once: ``submit_job`` against ``submit`` of the first
step), CPU per chain over the whole run, and the p50/p99 of a step's start after the step it
waits for ended.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bench.common import median, percentile, write_result
from floodway import Context, Floodway, Settings, Task
from floodway.config import ResourceConfig

#: the chain: (step, resource, latency s); each resource's work / cap is 4 s for 200 jobs
CHAIN = (
    ("s1", "vision", 0.040),
    ("s2", "llm", 0.020),
    ("s3", "speech", 0.160),
    ("s4", "llm", 0.020),
    ("s5", "vision", 0.040),
)
CAPS = {"vision": 4, "llm": 2, "speech": 8}
#: J1's floor: each resource's makespan over its optimum
J1_FLOOR = 1.10
Calls = dict[str, list[tuple[float, float]]]


@asynccontextmanager
async def engine(caps: dict[str, int], calls: Calls, scale: float = 1.0) -> AsyncIterator[Floodway]:
    with tempfile.TemporaryDirectory(prefix="floodway-bench-") as tmp:
        settings = Settings(
            database=f"sqlite:///{Path(tmp) / 'jobs.db'}",
            resources={r: ResourceConfig(concurrency=c) for r, c in caps.items()},
        )
        fw = Floodway(settings=settings)
        for step, resource, latency in CHAIN:
            fw.kind(step, resource=resource)(_handler(resource, latency * scale, calls))
        async with fw, fw.worker(concurrency=64):
            yield fw


def _handler(
    resource: str, latency: float, calls: Calls
) -> Callable[[Context, dict[str, Any]], Awaitable[dict[str, Any]]]:
    async def call(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        start = time.time()
        await asyncio.sleep(latency)
        calls[resource].append((start, time.time()))
        return {"job": value.get("job"), "from": ctx.task.kind}

    return call


def job_steps(n: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"name": "s1", "kind": "s1", "input": {"job": n}}]
    for i, (name, _, _) in enumerate(CHAIN[1:], start=1):
        before = CHAIN[i - 1][0]
        steps.append(
            {
                "name": name,
                "kind": name,
                "input": {"job": "${steps." + before + ".result.job}"},
                "after": [before],
            }
        )
    return steps


async def run_jobs(fw: Floodway, count: int) -> tuple[list[list[Task]], float, float]:
    """``count`` jobs at once: each job's tasks in chain order, the submit's wall and CPU."""
    wall, cpu = time.perf_counter(), time.process_time()
    jobs = await asyncio.gather(*(fw.submit_job(job_steps(n)) for n in range(count)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = [await fw.wait_job(j["id"], timeout=600) for j in jobs]
    chains = []
    for job in done:
        assert job["status"] == "succeeded", job["error"]
        chains.append([await fw.get(s["tasks"][0]["id"]) for s in job["steps"]])
    return chains, wall, cpu


async def run_by_hand(fw: Floodway, count: int) -> tuple[list[list[Task]], float, float]:
    """The same chains as caller code: each step submitted when the one before ended."""
    firsts: list[Task] = []
    wall, cpu = time.perf_counter(), time.process_time()
    firsts = list(
        await asyncio.gather(*(fw.submit("s1", {"job": n, "by": "hand"}) for n in range(count)))
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu

    async def chain(first: Task) -> list[Task]:
        tasks = [await fw.wait(first.id, timeout=600)]
        for name, _, _ in CHAIN[1:]:
            value = {"job": tasks[-1].result["job"], "by": "hand"}
            submitted = await fw.submit(name, value)
            tasks.append(await fw.wait(submitted.id, timeout=600))
        return tasks

    return list(await asyncio.gather(*(chain(t) for t in firsts))), wall, cpu


def start_gaps(chains: list[list[Task]]) -> list[float]:
    """Each step's start after the step before it ended."""
    return [
        (b.started_at or 0.0) - (a.finished_at or 0.0)
        for tasks in chains
        for a, b in itertools.pairwise(tasks)
    ]


def pipeline_bound(resource: str, work_s: float, scale: float = 1.0) -> float:
    """The shortest chain of calls ahead of ``resource``'s first step, its work over its cap,
    and the shortest chain after its last step: no schedule ends the run sooner."""
    on = [i for i, (_, r, _) in enumerate(CHAIN) if r == resource]
    latencies = [latency * scale for _, _, latency in CHAIN]
    ahead = sum(latencies[: on[0]])
    after = sum(latencies[on[-1] + 1 :])
    return ahead + work_s / CAPS[resource] + after


def handoffs(spans: list[tuple[float, float]], cap: int) -> list[float]:
    """For each call that ended while its resource was full, how long until the next call
    there started: what a slot's hand-off to waiting work costs."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    starts = sorted(s for s, _ in spans)
    gaps, running = [], 0
    for at, step in events:
        if step < 0 and running == cap:
            later = bisect.bisect_right(starts, at)
            if later < len(starts):
                gaps.append(starts[later] - at)
        running += step
    return gaps


async def j1(jobs: int, scale: float = 1.0) -> dict[str, Any]:
    calls: Calls = defaultdict(list)
    async with engine(CAPS, calls, scale) as fw:
        began = time.time()
        await run_jobs(fw, jobs)
    figures: dict[str, Any] = {}
    bound = 0.0
    for resource, cap in CAPS.items():
        spans = calls[resource]
        makespan = max(e for _, e in spans) - min(s for s, _ in spans)
        work = sum(e - s for s, e in spans)
        optimum = work / cap
        bound = max(bound, pipeline_bound(resource, work, scale))
        figures[resource] = {
            "cap": cap,
            "calls": len(spans),
            "makespan_s": makespan,
            "optimum_s": optimum,
            "ratio": makespan / optimum,
        }
        gaps = handoffs(spans, cap)
        if gaps:
            figures[resource]["handoff_p50_ms"] = 1000 * statistics.median(gaps)
            figures[resource]["handoff_p90_ms"] = 1000 * percentile(gaps, 90)
    whole = max(e for spans in calls.values() for _, e in spans) - began
    figures["run"] = {"makespan_s": whole, "optimum_s": bound, "ratio": whole / bound}
    return figures


async def j2(jobs: int) -> dict[str, Any]:
    roomy = dict.fromkeys(CAPS, 64)
    figures: dict[str, Any] = {}
    for name, run in (("jobs", run_jobs), ("by_hand", run_by_hand)):
        calls: Calls = defaultdict(list)
        async with engine(roomy, calls) as fw:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            chains, submit_wall, submit_cpu = await run(fw, jobs)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        gaps = start_gaps(chains)
        figures[name] = {
            "submits_per_s": jobs / submit_wall,
            "submit_cpu_ms": 1000 * submit_cpu / jobs,
            "cpu_ms_per_chain": 1000 * cpu / jobs,
            "wall_s": wall,
            "start_after_dependency_p50_ms": 1000 * statistics.median(gaps),
            "start_after_dependency_p99_ms": 1000 * percentile(gaps, 99),
        }
    return figures


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    first = runs[0]
    return {
        key: _medians([r[key] for r in runs])
        if isinstance(first[key], dict)
        else median([float(r[key]) for r in runs])
        for key in first
    }


async def main(runs: int, jobs: int, scale: float = 1.0) -> dict[str, Any]:
    j1_runs = [await j1(jobs, scale) for _ in range(runs)]
    j2_runs = [await j2(jobs) for _ in range(runs)] if scale == 1 else []
    figures = _medians(j1_runs)
    met = all(figures[r]["ratio"] <= J1_FLOOR for r in CAPS)
    return {"runs": runs, "jobs": jobs, "steps": len(CHAIN), "latency_scale": scale,
            "J1": figures, "J2": _medians(j2_runs) if j2_runs else None,
            "J1_floor": J1_FLOOR, "J1_met": met,
            "J1_ratio_range": {r: [min(x[r]["ratio"] for x in j1_runs),
                                   max(x[r]["ratio"] for x in j1_runs)] for r in CAPS}}  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="J1-J2: multi-step jobs")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="40 jobs, 1 run")
    parser.add_argument(
        "--latency-scale",
        type=float,
        default=1.0,
        help="J1 only, every call this many times longer",
    )
    args = parser.parse_args()
    runs, jobs = (1, 40) if args.quick else (args.runs, 200)
    scale = args.latency_scale
    figures = asyncio.run(main(runs, jobs, scale))
    name = "jobs" if scale == 1 else f"jobs-x{scale:g}"
    path = write_result(name + ("-quick" if args.quick else ""), figures)
    print(path.read_text())
