"""A worker process killed with SIGKILL while 50 upstream jobs run, then restarted: every task
completes from the job it had recorded (``upstream_ref``), and the provider's ledger shows no
job submitted or billed twice."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import httpx
import pytest

from floodway import Status
from floodway.providers.registry import aclose_kinds
from floodway.providers.sim import SimulatorConfig, running_simulator
from floodway.store.base import ClaimParams
from harness.processes import start_worker, until
from tests.integration.upstream_worker import build

APP = "tests.integration.upstream_worker:fw"
TASKS = 50


@pytest.mark.parametrize("moment", ["all-submitted", "polling"])
async def test_sigkill_with_jobs_in_flight_resumes_them_and_bills_once(
    tmp_path: Path, moment: str
) -> None:
    db_url = f"sqlite:///{tmp_path}/fw.db"
    config = SimulatorConfig(async_jobs=True, job_duration_ms=5000, latency_jitter=0.2, seed=9)
    async with running_simulator(config) as sim:
        fw = build(db_url, sim.url)
        try:
            tasks = await fw.submit_many("gen", [{"n": i} for i in range(TASKS)])
            first = start_worker(APP, db_url, sim.url, concurrency=8, log=tmp_path / "worker1.log")

            async def kill_now() -> bool:
                stats = sim.state.stats
                # Killed once every job runs upstream, or later while polls are being made
                # (then some tasks are held by the poller's lease, not parked).
                return stats.jobs_submitted >= TASKS and (
                    moment == "all-submitted" or stats.polls >= TASKS
                )

            await until(kill_now, 60)
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
            assert sim.state.stats.succeeded == 0, "jobs ended before the kill"
            refs = {t.id: (await fw.get(t.id)).upstream_ref for t in tasks}
            second = start_worker(APP, db_url, sim.url, concurrency=8, log=tmp_path / "worker2.log")
            try:

                async def all_terminal() -> bool:
                    return all([(await fw.get(t.id)).terminal for t in tasks])

                await until(all_terminal, 90)
            finally:
                second.send_signal(signal.SIGTERM)
                assert second.wait(30) == 0
            final = [await fw.get(t.id) for t in tasks]
        finally:
            await fw.close()
            await aclose_kinds(fw.kinds)
    assert Counter(t.status for t in final) == {Status.SUCCEEDED: TASKS}
    recorded = {task_id: ref for task_id, ref in refs.items() if ref is not None}
    assert recorded, "no job id was recorded before the kill"
    for task in final:  # resumed from the recorded job, never a new one
        if task.id in recorded:
            assert task.upstream_ref == recorded[task.id]
    assert sim.state.stats.jobs_submitted == TASKS
    ledger = sim.state.ledger.as_dict()
    assert ledger["double_charged"] == [] and ledger["total"] == TASKS


@pytest.mark.parametrize(
    ("recorded", "job_ms", "path"),
    [
        (True, 300, "resumed"),
        (False, 5000, "replayed"),  # still running when swept: resubmitted, the key replays it
        (False, 100, "looked-up"),  # finished when swept: the lookup by key takes its result
    ],
)
async def test_a_task_whose_worker_died_mid_handler_resumes_its_job(
    tmp_path: Path, recorded: bool, job_ms: int, path: str
) -> None:
    """The worker died holding the lease, after submitting the job and recording its id, or
    before recording it. Either way the task ends with that job's result, billed once."""
    config = SimulatorConfig(async_jobs=True, job_duration_ms=job_ms, latency_jitter=0)
    async with running_simulator(config) as sim:
        fw = build(f"sqlite:///{tmp_path}/fw.db", sim.url)
        try:
            task = await fw.submit("gen", {"n": 1})
            now = fw.clock.now()
            params = ClaimParams("dead-worker", "dead-lease", ("gen",), 1, now, lease_s=0.2)
            [claimed] = await fw.store.claim(params)
            async with httpx.AsyncClient() as client:
                answer = await client.post(
                    f"{sim.url}/generate",
                    json=claimed.input,
                    headers={"Idempotency-Key": claimed.work_key},
                )
            job = answer.json()["id"]
            if recorded:
                assert await fw.store.set_upstream_ref(task.id, "dead-lease", job, now)
            if path == "looked-up":  # the path is the job's state at the sweep, not a race

                async def job_finished() -> bool:
                    return sim.state.stats.succeeded == 1

                await until(job_finished, 10)
            async with fw.worker(concurrency=2):
                done = await fw.wait(task.id, timeout=30)
        finally:
            await fw.close()
            await aclose_kinds(fw.kinds)
    assert done.status is Status.SUCCEEDED and job in done.result["url"]
    assert done.upstream_ref == (None if path == "looked-up" else job)
    assert sim.state.stats.jobs_submitted == 1 and sim.state.ledger.total == 1
