"""Helpers shared by the tests that run real worker processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_worker(
    app: str, db_url: str, sim_url: str, log: Path, *, concurrency: int = 10, lease: str = "2s"
) -> subprocess.Popen[bytes]:
    """``floodway worker --app APP`` in its own process, on ``db_url``, calling ``sim_url``;
    a short lease so a killed worker's tasks are rescued quickly."""
    env = {
        **os.environ,
        "FLOODWAY_DATABASE": db_url,
        "SIM_URL": sim_url,
        "FLOODWAY_WORKER__LEASE": lease,
        "PYTHONPATH": str(ROOT),
    }
    command = [
        sys.executable,
        "-m",
        "floodway.cli",
        "worker",
        "--app",
        app,
        "--concurrency",
        str(concurrency),
    ]
    return subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float) -> None:
    """Poll ``predicate`` (a bounded wait on a real process, not a sleep-and-hope)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await predicate():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.02)
