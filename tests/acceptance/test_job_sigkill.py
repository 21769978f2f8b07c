"""Must-show 2 of multi-step jobs: the editor's 4-step job with a fan-out of 10, while the
process running it is SIGKILLed at a random point, then started again: every job completes,
no finished step runs again, and the provider (the simulator, which honours Idempotency-Key)
bills each step's work at most once. On ``floodway serve`` (SQLite) and on ``floodway worker``
(PostgreSQL). CI kills a few times; more with ``FLOODWAY_JOB_KILLS=20``."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from floodway import Floodway
from floodway.config import load_settings
from floodway.providers.sim import SimulatorConfig, running_simulator
from harness.pg import fresh_schema, postgres_unavailable, schema_url
from harness.processes import spawn_floodway, until, until_healthy
from tests.acceptance.clirun import free_port

KILLS = int(os.environ.get("FLOODWAY_JOB_KILLS", "3"))
ITEMS = 10
TASKS = 3 + ITEMS  # understand, script, one per paragraph, subtitles
KEY = "secret-key"


def write_config(tmp: Path, database: str, sim_url: str) -> Path:
    """Three resources with different caps; every kind calls the simulator, with its key (a
    call cut by a kill holds its provider slot until its timeout could have passed)."""
    kinds = "".join(
        f"""
[kinds.{kind}]
adapter = "http"
resource = "{resource}"
url = "{sim_url}/generate"
lookup_url = "{sim_url}/jobs?idempotency_key={{key}}"
options = {{ idempotent = true }}
timeout = "5s"
"""
        for kind, resource in (
            ("understand", "vision"),
            ("script", "llm"),
            ("tts", "speech"),
            ("subtitles", "llm"),
        )
    )
    config = tmp / "floodway.toml"
    config.write_text(f"""
database = "{database}"
[api]
keys = {{ "{KEY}" = "acme" }}
[worker]
lease = "2s"
[resources.vision]
concurrency = 1
[resources.llm]
concurrency = 2
[resources.speech]
concurrency = 3
{kinds}""")
    return config


def editor_job() -> dict[str, Any]:
    return {
        "steps": [
            {"name": "understand", "kind": "understand",
             "input": {"paragraphs": [f"p{i}" for i in range(ITEMS)]}},
            {"name": "script", "kind": "script",
             "input": {"paragraphs": "${steps.understand.result.echo.paragraphs}"},
             "after": ["understand"]},
            {"name": "tts", "kind": "tts", "input": {"text": "${item}", "n": "${index}"},
             "after": ["script"], "for_each": "${steps.script.result.echo.paragraphs}"},
            {"name": "subtitles", "kind": "subtitles",
             "input": {"audio": "${steps.tts.results}"}, "after": ["tts"]},
        ]
    }  # fmt: skip


def check_done(job: dict[str, Any]) -> None:
    assert job["status"] == "succeeded", job["error"]
    audio = job["result"]["subtitles"]["echo"]["audio"]
    assert [a["echo"]["text"] for a in audio] == [f"p{i}" for i in range(ITEMS)]
    assert job["progress"]["tasks"] == job["progress"]["tasks_done"] == TASKS


def kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def finished(job: dict[str, Any]) -> dict[str, str]:
    """The tasks of ``job`` that had ended well: they must stay as they are."""
    return {
        t["id"]: t["status"]
        for s in job["steps"]
        for t in s["tasks"]
        if t["status"] in ("succeeded", "deduped")
    }


@pytest.mark.timeout(120 + 40 * KILLS)
async def test_floodway_serve_sigkilled_mid_job_completes_it_billing_each_step_once(
    tmp_path: Path,
) -> None:
    rng = random.Random(26)
    sim_config = SimulatorConfig(latency_ms=40, latency_jitter=0.5, seed=26)
    async with running_simulator(sim_config) as sim:
        config = write_config(tmp_path, f"sqlite:///{tmp_path}/fw.db", sim.url)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = ["serve", "--config", str(config), "--port", str(port)]
        proc = spawn_floodway(args, {}, tmp_path / "serve-0.log")
        headers = {"Authorization": f"Bearer {KEY}"}
        try:
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http:
                await until_healthy(url, 90, "floodway serve")
                for run in range(KILLS):
                    before = sim.state.ledger.total
                    job = (await http.post("/v1/jobs", json=editor_job())).json()
                    target = before + rng.randint(1, TASKS - 1)

                    async def billed(target: int = target) -> bool:
                        return sim.state.ledger.total >= target

                    await until(billed, 60, "the job under way")
                    kill(proc)
                    proc = spawn_floodway(args, {}, tmp_path / f"serve-{run + 1}.log")
                    await until_healthy(url, 90, "floodway serve, again")
                    seen = finished((await http.get(f"/v1/jobs/{job['id']}")).json())

                    async def ended(job_id: str = job["id"]) -> bool:
                        got = (await http.get(f"/v1/jobs/{job_id}")).json()
                        return bool(got["status"] != "running")

                    await until(ended, 90, "the job's end")
                    done = (await http.get(f"/v1/jobs/{job['id']}")).json()
                    check_done(done)
                    assert {k: v for k, v in finished(done).items() if k in seen} == seen
        finally:
            stop(proc)
        ledger = sim.state.ledger
        assert ledger.as_dict()["double_charged"] == []
        assert ledger.total == KILLS * TASKS


@pytest.mark.timeout(120 + 40 * KILLS)
async def test_floodway_worker_on_postgresql_sigkilled_mid_jobs_completes_them_once(
    tmp_path: Path,
) -> None:
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    rng = random.Random(2026)
    sim_config = SimulatorConfig(latency_ms=40, latency_jitter=0.5, seed=7)
    async with fresh_schema() as schema, running_simulator(sim_config) as sim:
        database = schema_url(schema)
        config = write_config(tmp_path, database, sim.url)
        fw = Floodway(settings=load_settings(config))
        args = ["worker", "--config", str(config)]
        proc = spawn_floodway(args, {}, tmp_path / "worker-0.log")
        try:
            async with fw:
                jobs = [await fw.submit_job(editor_job()["steps"]) for _ in range(KILLS + 2)]
                for run in range(KILLS):
                    target = sim.state.ledger.total + rng.randint(1, TASKS // 2)

                    async def billed(target: int = target) -> bool:
                        return sim.state.ledger.total >= target

                    await until(billed, 60, "the jobs under way")
                    kill(proc)
                    proc = spawn_floodway(args, {}, tmp_path / f"worker-{run + 1}.log")
                done = [await fw.wait_job(j["id"], timeout=60 + 20 * KILLS) for j in jobs]
        finally:
            stop(proc)
        for job in done:
            check_done(job)
        ledger = sim.state.ledger
        assert ledger.as_dict()["double_charged"] == []
        assert ledger.total == len(jobs) * TASKS
