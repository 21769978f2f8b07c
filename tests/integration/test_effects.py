"""A completion's effects (a poison task's fallback, a dead task's alert) are written in the
completion's own transaction and delivered from the outbox: a crash right after the write
loses none, and a slow alert endpoint never holds a worker."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from fastapi import FastAPI, Request

from floodway import Context, Floodway, RetryableError, Status
from floodway.config import Settings
from floodway.serving import serve_app
from floodway.store.base import TaskChange, TaskQuery
from floodway.testing import sever
from tests.integration.conftest import eventually


class Crash(Exception):
    """The process dies the moment the write has committed (nothing after it runs)."""


def process(db_url: str, **settings: Any) -> Floodway:
    fw = Floodway(settings=Settings(database=db_url, **settings))

    @fw.kind("cheap")
    async def cheap(_ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        return {"url": "fallback", **value}

    @fw.kind("fancy", output_schema={"type": "object", "required": ["url"]}, fallback="cheap")
    async def fancy(_ctx: Context, _value: dict[str, Any]) -> dict[str, Any]:
        return {"garbage": True}

    return fw


async def test_a_crash_right_after_the_poison_write_still_gets_the_fallback(db_url: str) -> None:
    first = process(db_url)
    await first.open()

    def crash_on_poison(changes: Sequence[TaskChange]) -> None:
        if any(c.status is Status.FAILED for c in changes):
            raise Crash

    first.store.add_listener(crash_on_poison)
    async with AsyncExitStack() as alive:
        alive.push_async_callback(first.close)
        await alive.enter_async_context(first.worker(maintenance=False, grace_s=0))
        task = await first.submit("fancy", {"p": 1})

        async def failed() -> bool:
            return (await first.get(task.id)).status is Status.FAILED

        await eventually(failed)
        await sever(first)
    second = process(db_url)
    async with second, second.worker(grace_s=0):

        async def rescued() -> bool:
            follow = [t for t in await second.list_tasks(TaskQuery(kind="cheap"))]
            return len(follow) == 1 and follow[0].status is Status.SUCCEEDED

        await eventually(rescued)
        (follow,) = await second.list_tasks(TaskQuery(kind="cheap"))
        assert follow.metadata["fallback_of"] == task.id and follow.input == {"p": 1}


async def test_a_slow_alert_endpoint_does_not_delay_the_next_task(db_url: str) -> None:
    """Two dead tasks' alerts hang at the endpoint; the worker (one slot) runs the next task
    while both are still connected."""
    connected = 0
    release = asyncio.Event()
    receiver = FastAPI()

    @receiver.post("/alerts")
    async def alert(request: Request) -> dict[str, bool]:
        nonlocal connected
        connected += 1
        try:
            while not release.is_set() and not await request.is_disconnected():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(release.wait(), 0.02)
        finally:
            connected -= 1
        return {"ok": True}

    async with serve_app(receiver) as url:
        fw = Floodway(settings=Settings(database=db_url, alert_url=f"{url}/alerts"))

        @fw.kind("busy", max_attempts=1)
        async def busy(_ctx: Context, _value: dict[str, Any]) -> None:
            raise RetryableError("503 busy")

        @fw.kind("fine")
        async def fine(_ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
            return value

        async with fw, fw.worker(concurrency=1, grace_s=0):
            dead = [await fw.submit("busy", {"q": n}) for n in range(2)]
            for task in dead:
                assert (await fw.wait(task.id, timeout=10)).status is Status.DEAD

            async def both_hanging() -> bool:
                return connected == 2

            await eventually(both_hanging)
            after = await fw.submit("fine", {"n": 1})
            assert (await fw.wait(after.id, timeout=10)).status is Status.SUCCEEDED
            assert connected == 2  # the alerts still hang: the task did not wait on them
            release.set()
