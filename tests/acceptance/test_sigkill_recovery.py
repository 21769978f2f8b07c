"""Invariants 1 and 2 under a real crash: a worker process killed with SIGKILL in the middle
of 200 tasks, then restarted. Every task ends terminal, none is lost, none is billed twice."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

from floodway import Status
from floodway.providers.sim import SimulatorConfig, running_simulator
from harness.processes import start_worker, until
from tests.acceptance.sim_app import build

APP = "tests.acceptance.sim_app:fw"


async def test_sigkill_mid_batch_loses_nothing_and_charges_once(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path}/fw.db"
    config = SimulatorConfig(latency_ms=60, latency_jitter=0.2, max_concurrency=10, seed=3)
    async with running_simulator(config) as sim:
        fw = build(db_url, sim.url)
        try:
            tasks = await fw.submit_many("img", [{"n": i} for i in range(200)])
            first = start_worker(APP, db_url, sim.url, tmp_path / "worker1.log")

            async def some_charged() -> bool:
                return sim.state.ledger.total >= 50

            await until(some_charged, 60)
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
            charged_at_kill = sim.state.ledger.total
            assert charged_at_kill < 200, "the batch finished before the kill"
            second = start_worker(APP, db_url, sim.url, tmp_path / "worker2.log")
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
        states = Counter(t.status for t in final)
        assert states == {Status.SUCCEEDED: 200}, states
        ledger = sim.state.ledger
        assert ledger.as_dict()["double_charged"] == []
        assert ledger.total == 200
