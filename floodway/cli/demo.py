"""``floodway demo``: a batch of 200 images on the embedded default, offline, in about 40 s.

A simulated image API capped at 10 concurrent requests, with realistic faults (5xx, 429s, a
content refusal or two). 200 image tasks are submitted at once and one impatient user clicks
"generate" again on 20 of them. floodway keeps the API inside its cap, retries what is worth
retrying, bills nothing twice, and the summary says how close it came to the optimum.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from floodway.app import Floodway
from floodway.config import KindConfig, PriceConfig, ResourceConfig, Settings
from floodway.core.states import Status
from floodway.core.task import Task
from floodway.providers.sim import SimulatorConfig, running_simulator
from floodway.providers.sim.state import SimulatorState
from floodway.store.base import SpendQuery, SpendReport

PRICE_PER_IMAGE = 0.04  # dollars per billed image: the kind's price, for the spend ledger


@dataclass(frozen=True)
class DemoOptions:
    images: int = 200
    cap: int = 10
    latency_ms: float = 1500.0
    duplicates: int = 20
    error_rate: float = 0.05
    rate_limit_rate: float = 0.02
    refusal_rate: float = 0.01
    seed: int = 7
    database: str | None = None


def settings_for(sim_url: str, opts: DemoOptions, database: str) -> Settings:
    return Settings(
        database=database,
        resources={"image-api": ResourceConfig(concurrency=opts.cap, adaptive=True)},
        kinds={
            "image": KindConfig(
                adapter="http",
                resource="image-api",
                url=f"{sim_url}/generate",
                max_attempts=4,
                timeout=max(30.0, opts.latency_ms / 1000 * 4),
                deadline=max(900.0, opts.latency_ms / 1000 * opts.images),
                price=PriceConfig(per_request=PRICE_PER_IMAGE),
            )
        },
    )


def view(counts: Counter[str], sim: SimulatorState, elapsed: float, total: int) -> Group:
    table = Table(
        title=f"floodway demo: {total} tasks, provider cap {sim.config.max_concurrency} concurrent",
        expand=False,
    )
    for column in ("queued", "running", "retrying", "succeeded", "deduped", "failed", "dead"):
        table.add_column(column, justify="right")
    table.add_row(
        *(
            str(counts.get(c, 0))
            for c in ("queued", "running", "retrying", "succeeded", "deduped", "failed", "dead")
        )
    )
    stats = sim.stats
    done = sum(counts.get(s.value, 0) for s in (Status.SUCCEEDED, Status.DEDUPED))
    line = (
        f"elapsed {elapsed:5.1f}s  throughput {done / max(elapsed, 1e-9):5.1f}/s  "
        f"provider in flight {stats.in_flight:2d} (peak {stats.peak_concurrency})  "
        f"429s {stats.rate_limited}  5xx {stats.errors_5xx}  refusals {stats.refusals}"
    )
    return Group(table, line)


async def run_demo(opts: DemoOptions, console: Console) -> int:
    sim_cfg = SimulatorConfig(
        latency_ms=opts.latency_ms,
        latency_jitter=0.2,
        max_concurrency=opts.cap,
        error_rate=opts.error_rate,
        rate_limit_rate=opts.rate_limit_rate,
        refusal_rate=opts.refusal_rate,
        seed=opts.seed,
    )
    with tempfile.TemporaryDirectory() as tmp:
        database = opts.database or f"sqlite:///{Path(tmp) / 'demo.db'}"
        async with running_simulator(sim_cfg) as sim:
            fw = Floodway(settings=settings_for(sim.url, opts, database))
            async with fw:
                return await _run(fw, sim.state, sim.url, opts, console)


async def _run(
    fw: Floodway, sim: SimulatorState, sim_url: str, opts: DemoOptions, console: Console
) -> int:
    console.print(
        f"simulated image API at {sim_url} (cap {opts.cap}, ~{opts.latency_ms:.0f} ms"
        f" per image, {opts.error_rate:.0%} 5xx, {opts.rate_limit_rate:.0%} 429)"
    )
    started = time.time()
    async with fw.worker(concurrency=opts.cap * 2):
        prompts = [
            {"prompt": f"product photo #{i}, white background", "size": "1024x1024"}
            for i in range(opts.images)
        ]
        tasks: list[Task] = await fw.submit_many("image", prompts, lane="background")
        # The impatient user: the same prompts again (some with the same request key).
        again = [
            await fw.submit(
                "image",
                prompts[i],
                lane="background",
                key=f"click-{i}" if i % 2 else None,
                tenant="default",
            )
            for i in range(min(opts.duplicates, opts.images))
        ]
        ids = [t.id for t in tasks] + [t.id for t in again]
        latest = {t.id: t for t in [*tasks, *again]}  # a task is read again until it ends
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while True:
                for task_id, task in latest.items():
                    if not task.terminal:
                        latest[task_id] = await fw.get(task_id)
                counts = Counter(t.status.value for t in latest.values())
                live.update(view(counts, sim, time.time() - started, len(ids)))
                if all(t.terminal for t in latest.values()):
                    break
                await asyncio.sleep(0.25)
        if not console.is_terminal:
            # Rich ends a live view with a newline only on a terminal: in a file or a pipe its
            # last line would run into the summary's title.
            console.line()
    # From the start to the last task's end: the work's makespan, not this view's polling.
    makespan = max(t.finished_at or started for t in latest.values()) - started
    spend = await fw.spend(SpendQuery(since=0.0))
    return summarize([latest[i] for i in ids], sim, spend, makespan, opts, console)


def summarize(
    final: list[Task],
    sim: SimulatorState,
    spend: SpendReport,
    makespan: float,
    opts: DemoOptions,
    console: Console,
) -> int:
    states = Counter(t.status for t in final)
    ledger = sim.ledger.as_dict()
    # What the cap allows for the work the provider really did: its busy time (every call it
    # served, a 5xx as much as a success) spread over the cap.
    optimum = sim.stats.busy_s / opts.cap
    retries = sum(max(0, t.attempts - 1) for t in final)
    dead = [t for t in final if t.status in (Status.DEAD, Status.FAILED)]
    duplicates = opts.duplicates
    table = Table(title="summary", show_header=False)
    table.add_row("tasks", f"{len(final)} ({opts.images} images + {duplicates} double clicks)")
    table.add_row("succeeded", str(states[Status.SUCCEEDED]))
    table.add_row(
        "deduped (not charged)",
        str(states[Status.DEDUPED] + (len(final) - len({t.id for t in final}))),
    )
    table.add_row(
        "makespan",
        f"{makespan:.1f}s vs optimum {optimum:.1f}s ({makespan / optimum:.2f}x; the provider's "
        "busy time / cap)",
    )
    table.add_row("provider peak concurrency", f"{sim.stats.peak_concurrency} (cap {opts.cap})")
    table.add_row("429s / 5xx seen", f"{sim.stats.rate_limited} / {sim.stats.errors_5xx}")
    # A 429 is sent again without using an attempt: it is not among these.
    table.add_row("retries after a 5xx or a timeout", str(retries))
    table.add_row("failed or dead", str(len(dead)))
    for t in dead[:5]:
        why = t.error.message if t.error else "?"
        table.add_row(f"  {t.id}", f"{t.status.value}: {why}")  # wrapped by words, never cut
    table.add_row(
        "billed images", f"{ledger['total']} (double charged: {len(ledger['double_charged'])})"
    )
    # Both from floodway's spend ledger: priced usage of billed calls, and what deduped
    # tasks saved (the cost of the work whose result they took).
    spent = sum(line.cost for line in spend.lines)
    calls = sum(line.calls for line in spend.lines)
    table.add_row("spent", f"${spent:.2f} ({calls} billed calls at ${PRICE_PER_IMAGE:.2f})")
    saved = sum(line.saved for line in spend.lines)
    deduped = sum(line.deduped for line in spend.lines)
    table.add_row("money saved on duplicates", f"${saved:.2f} ({deduped} deduped)")
    console.print(table)
    lost = [t for t in final if not t.terminal]
    return 1 if lost or ledger["double_charged"] else 0
