"""A running dispatcher claims once per task that arrives, not three times: a slot of its own
freed by a handler or an outcome written (its own claim's, its own completion's) is no news
to a dispatcher that had free slots and found nothing to claim. Each claim that finds
nothing is a write transaction and two thread hops for nothing. And a slot handed on is
claimed before the outcome that freed it is written."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from floodway import Context, Floodway, Settings, Status
from floodway.config import ResourceConfig
from floodway.core.outcome import Applied, Completion
from floodway.store.base import ClaimParams, ReadyQuery
from floodway.testing import FakeClock, settle
from floodway.worker.worker import WorkerOptions


async def test_one_claim_per_task_submitted_to_an_idle_worker(
    fw: Floodway, clock: FakeClock
) -> None:
    @fw.kind("noop")
    async def noop(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        return value

    await fw.open()
    claims: list[int] = []
    claim = fw.store.claim

    async def counted(params: ClaimParams) -> list[Any]:
        got = await claim(params)
        claims.append(len(got))
        return got

    fw.store.claim = counted  # type: ignore[method-assign]
    async with fw.worker(concurrency=4):
        await settle()
        claims.clear()  # the first look at the queue, at start
        for n in range(10):  # one at a time: each finds the worker idle
            task = await fw.submit("noop", {"n": n})
            assert (await fw.wait(task.id, timeout=30)).status is Status.SUCCEEDED
            await settle()
    assert claims == [1] * 10


async def test_the_claim_that_fills_a_freed_slot_is_written_before_the_outcome_that_freed_it(
    db_url: str, clock: FakeClock
) -> None:
    """One writer: an outcome written first (a job's next step, a waiter's result) keeps the
    provider slot it freed idle until it is done. The hand-off's claim goes ahead of it."""
    settings = Settings(database=db_url, resources={"gpu": ResourceConfig(concurrency=1)})
    fw = Floodway(settings=settings, clock=clock)

    @fw.kind("render", resource="gpu")
    async def render(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        return value

    await fw.open()
    writes: list[tuple[str, tuple[str, ...]]] = []
    claim, complete = fw.store.claim, fw.store.complete

    async def claiming(params: ClaimParams) -> list[Any]:
        writes.append(("claim", params.ids))
        return await claim(params)

    async def completing(items: Sequence[Completion], now: float) -> list[Applied]:
        writes.append(("outcome", tuple(i.task_id for i in items)))
        return await complete(items, now)

    fw.store.claim = claiming  # type: ignore[method-assign]
    fw.store.complete = completing  # type: ignore[method-assign]
    try:
        tasks = [await fw.submit("render", {"n": n}) for n in range(4)]
        async with fw.worker(concurrency=4):
            for task in tasks:
                assert (await fw.wait(task.id, timeout=30)).status is Status.SUCCEEDED
    finally:
        await fw.close()
    order = [(what, ids) for what, ids in writes if ids]
    claimed = [ids for what, ids in order if what == "claim"]
    assert sorted(i for ids in claimed for i in ids) == sorted(t.id for t in tasks)
    for before, after in itertools.pairwise(claimed):
        (freed_by,) = [
            n for n, (what, ids) in enumerate(order) if what == "outcome" and before[0] in ids
        ]
        assert order.index(("claim", after)) < freed_by, order


async def test_a_pass_lists_the_kinds_whose_resource_has_room_and_every_kind_once_per_idle_period(
    db_url: str, clock: FakeClock
) -> None:
    """While the gpu is full, the cpu's completions wake the dispatcher: those passes list the
    cpu's queue, not the gpu's waiting work. Once per idle period every kind is listed anyway
    (a task may take over a slot its own orphaned call holds, which the count shows as taken)."""
    settings = Settings(
        database=db_url,
        resources={"gpu": ResourceConfig(concurrency=1), "cpu": ResourceConfig(concurrency=4)},
    )
    fw = Floodway(settings=settings, clock=clock)
    gpu_free = asyncio.Event()

    @fw.kind("render", resource="gpu")
    async def render(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        await gpu_free.wait()
        return value

    @fw.kind("echo", resource="cpu")
    async def echo(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        return value

    await fw.open()
    listed: list[tuple[str, ...]] = []
    ready = fw.store.ready

    async def listing(query: ReadyQuery) -> list[Any]:
        listed.append(tuple(sorted(query.kinds)))
        return await ready(query)

    fw.store.ready = listing  # type: ignore[method-assign]
    try:
        renders = [await fw.submit("render", {"n": n}) for n in range(3)]
        async with fw.worker(concurrency=8):
            await settle()
            assert (await fw.get(renders[0].id)).status is Status.RUNNING
            listed.clear()
            for n in range(5):
                task = await fw.submit("echo", {"n": n})
                assert (await fw.wait(task.id, timeout=30)).status is Status.SUCCEEDED
            assert listed and set(listed) == {("echo",)}, listed
            listed.clear()
            await clock.advance(WorkerOptions.idle_poll_s)
            await settle()
            assert ("echo", "render") in listed, listed
            gpu_free.set()
            for task in renders:
                assert (await fw.wait(task.id, timeout=30)).status is Status.SUCCEEDED
    finally:
        gpu_free.set()
        await fw.close()
