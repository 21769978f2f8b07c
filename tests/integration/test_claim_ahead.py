"""A worker whose handlers return fast claims tasks ahead of its free slots; those tasks are
handed back on shutdown without an attempt spent, never started; a limited resource or slow
handlers turn claiming ahead off."""

from __future__ import annotations

import asyncio
from typing import Any

from floodway import Context, Floodway, Status
from floodway.config import ResourceConfig, Settings
from floodway.testing import FakeClock
from floodway.worker.worker import Worker, WorkerOptions

CONCURRENCY, BATCH = 2, 4


def _blocking_kind(fw: Floodway, resource: str | None = None) -> list[int]:
    """A kind whose first task returns at once (handlers are fast so far) and whose others
    block; the list collects the tasks whose handler started."""
    started: list[int] = []
    gate = asyncio.Event()

    @fw.kind("k", resource=resource, dedupe=False)
    async def handler(ctx: Context, value: dict[str, Any]) -> None:
        started.append(value["n"])
        if value["n"]:
            await gate.wait()

    return started


async def _running(fw: Floodway) -> int:
    return (await fw.store.stats()).by_status[Status.RUNNING.value]


async def _until(predicate: Any) -> None:
    for _ in range(500):
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached in 5 s")


async def _run_ten(fw: Floodway, started: list[int], ahead_wait_s: float = 30.0) -> Worker:
    options = WorkerOptions(
        concurrency=CONCURRENCY, claim_batch=BATCH, grace_s=0.05, ahead_wait_s=ahead_wait_s
    )
    worker = Worker(fw.runtime, options)
    await worker.start()
    first = await fw.submit("k", {"n": 0})
    await fw.wait(first.id, timeout=5)
    await fw.submit_many("k", [{"n": n} for n in range(1, 11)])  # visible at once

    async def slots_full() -> bool:
        return len(started) == 1 + CONCURRENCY

    await _until(slots_full)
    return worker


async def test_tasks_claimed_ahead_are_handed_back_unstarted_on_stop(fw: Floodway) -> None:
    started = _blocking_kind(fw)
    await fw.open()
    worker = await _run_ten(fw, started)

    async def claimed_ahead() -> bool:
        return await _running(fw) > CONCURRENCY

    await _until(claimed_ahead)
    assert await _running(fw) <= CONCURRENCY + BATCH
    await worker.stop()
    assert len(started) == 1 + CONCURRENCY  # no task claimed ahead started during the grace
    tasks = await fw.list_tasks()
    assert {t.status for t in tasks if t.input["n"]} == {Status.QUEUED, Status.RETRYING}
    assert all(t.attempts == 0 for t in tasks if t.input["n"])  # none spent an attempt


async def test_tasks_claimed_ahead_go_back_when_no_slot_frees_in_time(fw: Floodway) -> None:
    """Handlers turned slow: what waits for a slot goes back to the queue, unstarted and with
    no attempt spent, for any worker to take, and this one stops claiming ahead."""
    started = _blocking_kind(fw)
    await fw.open()
    worker = await _run_ten(fw, started, ahead_wait_s=0.05)

    async def handed_back() -> bool:
        tasks = await fw.list_tasks()
        return sum(t.status is Status.RETRYING for t in tasks) > 0 and (
            await _running(fw) == CONCURRENCY
        )

    await _until(handed_back)
    await asyncio.sleep(0.2)  # time for another claim ahead, were there one
    assert await _running(fw) == CONCURRENCY
    assert len(started) == 1 + CONCURRENCY
    waiting = [t for t in await fw.list_tasks() if t.input["n"] and t.status is not Status.RUNNING]
    assert waiting and all(t.attempts == 0 for t in waiting)
    await worker.stop()


async def test_a_limited_resource_is_never_claimed_ahead(db_url: str, clock: FakeClock) -> None:
    settings = Settings(database=db_url, resources={"p": ResourceConfig(concurrency=100)})
    fw = Floodway(settings=settings, clock=clock)
    started = _blocking_kind(fw, resource="p")
    async with fw:
        worker = await _run_ten(fw, started)
        await asyncio.sleep(0.2)  # time for a claim ahead, were there one
        assert await _running(fw) == CONCURRENCY
        await worker.stop()
