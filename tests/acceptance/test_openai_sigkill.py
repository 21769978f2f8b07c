"""A ``floodway serve`` SIGKILLed while a background response runs: after the restart the
response completes and the provider billed it once. The provider is ``floodway simulate
--openai``, which honours Idempotency-Key (the kind says ``idempotent``): recovery sends the
work again under the same key and the provider replays it (docs/guarantees.md, first row)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from harness.processes import spawn_floodway, until, until_healthy
from tests.acceptance.clirun import free_port

pytestmark = pytest.mark.slow

CONFIG = """\
database = "sqlite:///{folder}/floodway.db"
[api]
keys = {{ "key-a" = "tenant-a" }}
[worker]
lease = "2s"
[kinds.respond]
adapter = "openai"
endpoint = "responses"
base_url = "{provider}/v1"
models = ["gpt-4.1-mini"]
options = {{ idempotent = true }}
"""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_a_background_response_outlives_a_sigkill_and_is_billed_once(
    tmp_path: Path,
) -> None:
    sim_port, port = free_port(), free_port()
    provider, url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{port}"
    sim = spawn_floodway(
        ["simulate", "--openai", "--port", str(sim_port), "--latency-ms", "300",
         "--chunk-ms", "300"], {}, tmp_path / "sim.log",
    )  # fmt: skip
    config = tmp_path / "floodway.toml"
    config.write_text(CONFIG.format(folder=tmp_path, provider=provider))
    serve_args = ["serve", "--config", str(config), "--port", str(port)]
    served = spawn_floodway(serve_args, {}, tmp_path / "serve-1.log")
    client = openai.AsyncOpenAI(base_url=f"{url}/openai/v1", api_key="key-a", max_retries=0)
    try:
        async with httpx.AsyncClient(base_url=provider) as http:

            async def stats() -> dict[str, int]:
                try:
                    return dict((await http.get("/stats")).json())
                except httpx.HTTPError:
                    return {}

            async def calling() -> bool:
                return (await stats()).get("in_flight", 0) > 0

            await until_healthy(url, 30, "floodway serve")
            queued = await client.responses.create(
                model="gpt-4.1-mini", input="one two three four five six seven", background=True
            )
            assert queued.status == "queued"
            await until(calling, 30, "the provider streams the response")
            os.kill(served.pid, signal.SIGKILL)
            served.wait()
            served = spawn_floodway(serve_args, {}, tmp_path / "serve-2.log")
            await until_healthy(url, 30, "floodway serve, restarted")

            async def completed() -> bool:
                return (await client.responses.retrieve(queued.id)).status == "completed"

            await until(completed, 60, "the response completed after the restart")
            done = await client.responses.retrieve(queued.id)
            assert done.output_text == "echo: one two three four five six seven"
            ledger = (await http.get("/ledger")).json()
            assert ledger["total"] == 1 and ledger["double_charged"] == []
            assert (await stats())["requests"] >= 2  # sent again after the kill: replayed
    finally:
        await client.close()
        _stop(served)
        _stop(sim)
