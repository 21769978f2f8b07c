"""Helpers shared by the tests that run real worker processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def spawn_floodway(args: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``python -m floodway.cli ARGS`` in its own process, from the repository root (so
    ``--app tests...`` and ``--app bench...`` import), with ``env`` added; output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "floodway.cli", *args],
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def start_worker(
    app: str,
    db_url: str,
    sim_url: str,
    log: Path,
    *,
    concurrency: int = 10,
    lease: str | None = "2s",
) -> subprocess.Popen[bytes]:
    """``floodway worker --app APP`` in its own process, on ``db_url``, calling ``sim_url``;
    a short lease by default (a hung worker's tasks are rescued quickly), or floodway's own
    with ``lease=None``."""
    env = {"FLOODWAY_DATABASE": db_url, "SIM_URL": sim_url}
    if lease is not None:
        env["FLOODWAY_WORKER__LEASE"] = lease
    return spawn_floodway(["worker", "--app", app, "--concurrency", str(concurrency)], env, log)


async def until(
    predicate: Callable[[], Awaitable[bool]], timeout: float, what: str = "the condition"
) -> None:
    """Poll ``predicate`` every 20 ms until it holds (a bounded wait on a real process, not a
    sleep-and-hope); fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await predicate():
        if loop.time() > end:
            raise AssertionError(f"not reached within {timeout:g} s: {what}")
        await asyncio.sleep(0.02)


async def answers_healthz(url: str) -> bool:
    """Whether the floodway server at ``url`` answers ``GET /healthz`` with 200 (not up yet,
    or gone: False)."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=2) as http:
            return (await http.get("/healthz")).status_code == 200
    except httpx.HTTPError:
        return False


async def until_healthy(url: str, timeout: float, what: str = "floodway") -> None:
    """Wait until the server at ``url`` is up (its ``/healthz`` answers 200)."""
    await until(lambda: answers_healthz(url), timeout, f"{what} answers /healthz")
