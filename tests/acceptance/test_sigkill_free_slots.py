"""A worker process killed with SIGKILL while it drains a fast kind that is not idempotent:
only the tasks whose call may have been sent fail ``interrupted``. A worker claims for its
free slots only (a claim opens the attempt), so at most one task per slot is running and one
per slot has its outcome on the way to the ledger; every other task runs once, later."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from floodway import Floodway, Status
from harness.fleet import fresh_database
from harness.processes import spawn_floodway, until
from tests.acceptance.noop_app import CALL_TIMEOUT_S, build

APP = "tests.acceptance.noop_app:fw"
TASKS = 3000
CONCURRENCY = 10


def _worker(db_url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {"FLOODWAY_DATABASE": db_url, "FLOODWAY_WORKER__LEASE": "5s"}
    return spawn_floodway(["worker", "--app", APP, "--concurrency", str(CONCURRENCY)], env, log)


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/fw.db"
        return
    async with fresh_database() as url:
        yield url


async def _running(fw: Floodway) -> set[str]:
    """The tasks the ledger holds as running: their attempts are open."""
    return {t.id for t in await fw.store.open_attempts(TASKS) if t.status is Status.RUNNING}


async def _states(fw: Floodway, ids: list[str]) -> Counter[Status]:
    return Counter([(await fw.get(i)).status for i in ids])


async def test_sigkill_fails_only_the_tasks_whose_call_may_have_been_sent(
    db_url: str, tmp_path: Path
) -> None:
    fw = build(db_url)
    try:
        ids = [t.id for t in await fw.submit_many("noop", [{"n": i} for i in range(TASKS)])]
        first = _worker(db_url, tmp_path / "worker1.log")

        async def draining() -> bool:
            return (await fw.store.stats()).by_status.get("succeeded", 0) >= 300

        await until(draining, 60, "300 tasks succeeded")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        held = await _running(fw)
        # The handlers' tasks (one per slot) and those whose outcome was being written
        # (claims pause while more than one per slot are).
        assert len(held) <= 2 * CONCURRENCY, f"{len(held)} running for {CONCURRENCY} slots"

        second = _worker(db_url, tmp_path / "worker2.log")
        try:

            async def all_terminal() -> bool:
                return all([(await fw.get(i)).terminal for i in ids])

            await until(all_terminal, 120, "every task terminal")
            failed = {i for i in ids if (await fw.get(i)).status is Status.FAILED}
            assert failed <= held, f"failed though not running at the kill: {failed - held}"
            for task_id in failed:
                task = await fw.get(task_id)
                assert task.error is not None and task.error.type == "worker_lost"
            for task_id in set(ids) - held:
                task = await fw.get(task_id)
                assert (task.status, task.attempts) == (Status.SUCCEEDED, 1), task
            # The ones running at the kill may have been called: retried by hand once their
            # calls could have ended, they succeed too.
            await until(lambda: _bounds_passed(fw, failed), 10 * CALL_TIMEOUT_S, "bounds")
            for task_id in failed:
                await fw.retry(task_id)
            await until(all_terminal, 60, "the retried tasks terminal")
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
        assert await _states(fw, ids) == {Status.SUCCEEDED: TASKS}
    finally:
        await fw.close()


async def _bounds_passed(fw: Floodway, ids: set[str]) -> bool:
    """Every one's last call has surely ended (its open attempt closed by the sweeper)."""
    return all([(await fw.get(i)).lease_token is None for i in ids])
