"""``floodway demo --job``: the editor's chain as one job, with a SIGKILL in the middle.

understand (a video model) -> script (an LLM) -> tts, once per paragraph (a speech API) ->
subtitles (the LLM again) -> export, each on a simulated provider with a cap of its own. The
job runs in a ``floodway worker`` child process; half-way through the speech it is killed
with SIGKILL and a new one started. The job carries on from the step it was on: the summary
shows every step billed once by the provider, and none run again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from floodway.app import Floodway
from floodway.config import load_settings
from floodway.core.jobs import work_key
from floodway.providers.sim import SimulatorConfig, running_simulator
from floodway.providers.sim.state import SimulatorState

PARAGRAPHS = 8
#: (kind, resource, cap): each provider's own limit
KINDS = (
    ("understand", "video-model", 1),
    ("script", "llm", 2),
    ("tts", "speech-api", 3),
    ("subtitles", "llm", 2),
    ("export", "renderer", 1),
)


def editor_steps(paragraphs: int) -> list[dict[str, Any]]:
    return [
        {"name": "understand", "kind": "understand",
         "input": {"video": "launch.mp4", "paragraphs": [f"scene {i}" for i in range(paragraphs)]}},
        {"name": "script", "kind": "script",
         "input": {"scenes": "${steps.understand.result.echo.paragraphs}"},
         "after": ["understand"]},
        {"name": "tts", "kind": "tts", "input": {"text": "${item}", "paragraph": "${index}"},
         "after": ["script"], "for_each": "${steps.script.result.echo.scenes}"},
        {"name": "subtitles", "kind": "subtitles",
         "input": {"audio": "${steps.tts.results}"}, "after": ["tts"]},
        {"name": "export", "kind": "export",
         "input": {"subtitles": "${steps.subtitles.result.url}", "video": "launch.mp4"},
         "after": ["subtitles"]},
    ]  # fmt: skip


def write_config(tmp: Path, sim_url: str) -> Path:
    resources = "".join(
        f"[resources.{resource}]\nconcurrency = {cap}\n"
        for resource, cap in {r: c for _, r, c in KINDS}.items()
    )
    kinds = "".join(
        f"""[kinds.{kind}]
adapter = "http"
resource = "{resource}"
url = "{sim_url}/generate"
lookup_url = "{sim_url}/jobs?idempotency_key={{key}}"
timeout = "10s"
options = {{ idempotent = true }}
"""
        for kind, resource, _ in KINDS
    )
    config = tmp / "floodway.toml"
    config.write_text(
        f'database = "sqlite:///{tmp / "demo.db"}"\n[worker]\nlease = "2s"\n{resources}{kinds}'
    )
    return config


def start_worker(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "floodway.cli", "worker", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def run_job_demo(console: Console, latency_ms: float = 300.0) -> int:
    sim_config = SimulatorConfig(latency_ms=latency_ms, latency_jitter=0.3, seed=26)
    with tempfile.TemporaryDirectory() as tmp:
        async with running_simulator(sim_config) as sim:
            config = write_config(Path(tmp), sim.url)
            fw = Floodway(settings=load_settings(config))
            async with fw:
                return await _run(fw, sim.state, config, Path(tmp) / "worker.log", console)


async def _run(fw: Floodway, sim: SimulatorState, config: Path, log: Path, console: Console) -> int:
    caps = ", ".join(f"{kind} {cap}" for kind, _, cap in KINDS)
    console.print(f"the editor's chain as one job, on simulated providers (caps: {caps})")
    job = await fw.submit_job(editor_steps(PARAGRAPHS))
    console.print(f"job {job['id']}: {len(job['steps'])} steps, the speech once per paragraph")
    started = time.time()
    worker = start_worker(config, log)
    try:
        middle = 2 + PARAGRAPHS // 2  # understand, script, then half the paragraphs
        while sim.ledger.total < middle:  # noqa: ASYNC110 (the simulator's bills have no event)
            await asyncio.sleep(0.05)
        before = await fw.get_job(job["id"])
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        console.print(
            f"[bold red]SIGKILL[/] the worker at {time.time() - started:.1f}s: "
            f"{_where(before)}; a new worker starts"
        )
        worker = start_worker(config, log)
        done = await fw.wait_job(job["id"], timeout=300)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
    console.print(_summary(done, before, sim))
    double = sim.ledger.as_dict()["double_charged"]
    tasks = done["progress"]["tasks"]
    console.print(
        f"job {done['status']} in {time.time() - started:.1f}s: {tasks} tasks, "
        f"{sim.ledger.total} billed by the providers, {len(double)} billed twice"
    )
    return 0 if done["status"] == "succeeded" and not double else 1


def _where(job: dict[str, Any]) -> str:
    parts = []
    for step in job["steps"]:
        ended = sum(t["status"] in ("succeeded", "deduped") for t in step["tasks"])
        if step["tasks"]:
            parts.append(f"{step['name']} {ended}/{len(step['tasks'])} done")
    return ", ".join(parts)


def _summary(job: dict[str, Any], before: dict[str, Any], sim: SimulatorState) -> Table:
    finished_before = {
        t["id"]
        for s in before["steps"]
        for t in s["tasks"]
        if t["status"] in ("succeeded", "deduped")
    }
    table = Table(title="each step: its tasks, and what the providers billed")
    for column in ("step", "tasks", "done before the kill", "billed", "status"):
        table.add_column(column, justify="left" if column in ("step", "status") else "right")
    charges = sim.ledger.charges
    for step in job["steps"]:
        ids = [t["id"] for t in step["tasks"]]
        keys = [work_key(job["id"], step["name"], t["index"]) for t in step["tasks"]]
        table.add_row(
            step["name"],
            str(len(ids)),
            str(sum(i in finished_before for i in ids)),
            str(sum(charges.get(k, 0) for k in keys)),
            step["status"],
        )
    return table
