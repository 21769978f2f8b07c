"""`floodway stats` with a tenant's key against `floodway serve`: the resources its kinds use,
with their limits, and its caps (it printed "resources": {} for every tenant before)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

from floodway.providers.sim import SimulatorConfig, running_simulator
from harness.processes import ROOT, until_healthy
from tests.acceptance.clirun import cli, free_port


async def test_a_tenants_stats_show_the_limits_of_its_kinds(tmp_path: Path) -> None:
    async with running_simulator(SimulatorConfig(latency_ms=10, seed=1)) as sim:
        config = tmp_path / "floodway.toml"
        config.write_text(f"""
database = "sqlite:///{tmp_path}/fw.db"
[api]
keys = {{ "key-a" = "acme" }}
[tenants]
concurrency = 3
[resources.image-api]
concurrency = 2
requests_per_minute = 600
[resources.unused]
concurrency = 9
[kinds.img]
adapter = "http"
url = "{sim.url}/generate"
resource = "image-api"
""")
        port = free_port()
        serve = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "floodway.cli", "serve", "--config", str(config), "--port", str(port)),
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            await until_healthy(url, 20, "floodway serve")
            env = {"FLOODWAY_URL": url, "FLOODWAY_API_KEY": "key-a"}
            code, out, err = await cli("submit", "img", "--input", '{"p": 1}', "--wait", env=env)
            assert code == 0, err
            code, out, err = await cli("stats", env=env)
            assert code == 0, err
        finally:
            serve.send_signal(signal.SIGTERM)
            await asyncio.wait_for(serve.wait(), 30)
    stats = json.loads(out)
    assert stats["tenant"] == "acme"
    assert set(stats["resources"]) == {"image-api"}  # its kinds' only
    image = stats["resources"]["image-api"]
    assert image["kinds"] == ["img"] and image["in_flight"] == 0
    assert image["limits"]["concurrency"]["value"] == 2
    assert image["limits"]["requests"]["source"] == "configured"
    assert stats["caps"]["concurrency"] == {"limit": 3.0, "use": 0.0, "unit": "in flight"}
