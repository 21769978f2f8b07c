"""The engine counts provider calls, 429s and 5xx from real HTTP answers."""

from __future__ import annotations

from pathlib import Path

from floodway import Floodway, Status
from floodway.config import KindConfig, Settings
from floodway.providers.sim import SimulatorConfig, running_simulator


async def test_calls_429s_and_5xx_are_counted(tmp_path: Path) -> None:
    async with running_simulator(SimulatorConfig(latency_ms=5, seed=2)) as sim:
        settings = Settings(
            database=f"sqlite:///{tmp_path}/fw.db",
            kinds={"img": KindConfig(adapter="http", url=f"{sim.url}/generate", max_attempts=1)},
        )
        async with Floodway(settings=settings) as fw, fw.worker():
            inputs = [
                {"n": 1},
                {"n": 2},
                {"n": 3, "fail": "5xx"},
                {"n": 4, "fail": "429"},
                {"n": 5, "fail": "refusal"},
            ]
            tasks = await fw.submit_many("img", inputs)
            done = [await fw.wait(t.id, timeout=20) for t in tasks[:3] + tasks[4:]]
            assert [t.status for t in done] == [
                Status.SUCCEEDED,
                Status.SUCCEEDED,
                Status.DEAD,
                Status.FAILED,
            ]
            counts = fw.runtime.upstream_counts.as_dict()
    assert counts["calls"] >= 5
    assert counts["server_errors"] == 1  # the refusal (400) is neither a 429 nor a 5xx
    assert counts["throttled"] >= 1
    assert 0 < counts["server_error_rate"] < 1
