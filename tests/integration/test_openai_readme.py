"""The README's "Use it from the OpenAI SDK" blocks, run as written against the OpenAI
simulator its shell block starts (``floodway simulate --openai``, here in-process): its TOML
declares the kind (only the simulator's port is this test's), its Python calls floodway with
the official SDK (only the host is this test server's)."""

from __future__ import annotations

import asyncio
import io
import re
import tomllib
from contextlib import AsyncExitStack, redirect_stdout
from pathlib import Path

import pytest

from floodway.api import serving
from floodway.config import KindConfig, ResourceConfig
from floodway.providers.sim import SimulatorConfig
from floodway.providers.sim.openai import create_openai_simulator_app
from tests.integration.conftest import StartApi

README = Path(__file__).resolve().parents[2] / "README.md"


def _blocks(lang: str) -> list[str]:
    text = README.read_text()
    start = text.index("## Use it from the OpenAI SDK")
    section = text[start : text.index("\n## ", start)]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.DOTALL)


async def test_the_readme_lines_answer_through_floodway(
    start_api: StartApi, api_stack: AsyncExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-server-side")
    (config,) = _blocks("toml")
    (code,) = _blocks("python")
    (shell,) = _blocks("bash")
    assert "floodway simulate --openai --port 9001 --latency-ms 50" in shell
    app = create_openai_simulator_app(SimulatorConfig(latency_ms=50))
    upstream = await api_stack.enter_async_context(serving(app))
    declared = tomllib.loads(config.replace("http://127.0.0.1:9001", upstream))
    kinds = {n: KindConfig(**c) for n, c in declared["kinds"].items()}
    resources = {n: ResourceConfig(**c) for n, c in declared["resources"].items()}
    server = await start_api(keys={"key-a": "tenant-a"}, kinds=kinds, resources=resources)
    printed = io.StringIO()

    def run() -> None:
        with redirect_stdout(printed):
            exec(code.replace("http://127.0.0.1:8000", server.url), {})

    await asyncio.to_thread(run)
    assert printed.getvalue() == "echo: hi\necho: hi"  # the answer, then the same streamed
    assert app.state.simulator.core.ledger.total == 2
