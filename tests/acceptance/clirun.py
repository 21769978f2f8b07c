"""Running the ``floodway`` command as a user would: a subprocess, and a served
``floodway serve`` (against a simulated provider) for the commands that talk to one."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from floodway.providers.sim import SimulatorConfig, running_simulator
from harness.processes import ROOT, until_healthy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def cli(
    *args: str, env: dict[str, str] | None = None, columns: int = 200
) -> tuple[int, str, str]:
    """``floodway ARGS`` -> (exit code, stdout, stderr); ``columns`` is the terminal width."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "floodway.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": str(columns), **(env or {})},
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@dataclass(frozen=True)
class Served:
    url: str
    tmp: Path
    env: dict[str, str]  # FLOODWAY_URL and FLOODWAY_API_KEY for the client commands


@asynccontextmanager
async def served(tmp: Path, *, max_attempts: int = 2) -> AsyncIterator[Served]:
    """``floodway serve`` with an API key and the kind ``img`` on a simulated provider."""
    async with running_simulator(SimulatorConfig(latency_ms=10, seed=1)) as sim:
        config = tmp / "floodway.toml"
        config.write_text(f"""
database = "sqlite:///{tmp}/fw.db"
[api]
keys = {{ "secret-key" = "acme" }}
[kinds.img]
adapter = "http"
url = "{sim.url}/generate"
max_attempts = {max_attempts}
""")
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "floodway.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            await until_healthy(url, 20, "floodway serve")
            env = {"FLOODWAY_URL": url, "FLOODWAY_API_KEY": "secret-key"}
            yield Served(url, tmp, env)
        finally:
            proc.send_signal(signal.SIGTERM)
            # uvicorn shuts down gracefully, then re-raises the signal it caught
            assert await asyncio.wait_for(proc.wait(), 30) in (0, -signal.SIGTERM)
