"""A running dispatcher claims once per task that arrives, not three times: a slot of its own
freed by a handler or an outcome written (its own claim's, its own completion's) is no news
to a dispatcher that had free slots and found nothing to claim. Each claim that finds
nothing is a write transaction and two thread hops for nothing."""

from __future__ import annotations

from typing import Any

from floodway import Context, Floodway, Status
from floodway.store.base import ClaimParams
from floodway.testing import FakeClock, settle


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
