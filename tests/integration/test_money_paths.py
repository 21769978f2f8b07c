"""The money paths: no path pays twice for the same work, and no tenant sees another's.

Each test is one way the same work could be paid for twice (or leak across tenants) and pins
the rule that prevents it. The provider here ignores Idempotency-Key: every call it serves is
a charge. Time is a fake clock; a call "in flight" is a handler waiting on an event the test
sets.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from floodway import (
    AttemptStillOpen,
    Context,
    Floodway,
    RetryableError,
    Settings,
    Status,
    SubmitRequest,
)
from floodway.core import changes
from floodway.core.task import ErrorClass, ErrorInfo
from floodway.store.base import ClaimParams
from floodway.testing import FakeClock, sever


class Provider:
    """A billed provider that ignores Idempotency-Key: every call is charged. ``hold`` keeps
    calls in flight until the test releases them; ``fail_next`` makes calls answer 503."""

    def __init__(self) -> None:
        self.charges: Counter[str] = Counter()
        self.in_flight = 0
        self.peak = 0
        self.fail_next = 0
        self.hold = asyncio.Event()
        self.hold.set()
        self.started = asyncio.Event()

    async def handler(self, ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.started.set()
        try:
            await self.hold.wait()
            if self.fail_next:
                self.fail_next -= 1
                raise RetryableError("503 Service Unavailable", status=503)
            self.charges[repr(sorted(value.items()))] += 1
            return {"image": f"{value['prompt']} #{sum(self.charges.values())}"}
        finally:
            self.in_flight -= 1

    @property
    def total(self) -> int:
        return sum(self.charges.values())


async def _has_status(fw: Floodway, task_id: str, status: Status) -> bool:
    return (await fw.get(task_id)).status is status


async def _advance_until(clock: FakeClock, check: Callable[[], Awaitable[bool]]) -> None:
    """Time moves in small steps until ``check()`` holds: on a loaded machine the sweeper
    may still be in its pass when one step is taken, and sleep past it."""
    async with asyncio.timeout(20):
        while not await check():
            await clock.advance(0.5)
            await asyncio.sleep(0.01)


@pytest.fixture
def provider(fw: Floodway) -> Provider:
    p = Provider()
    fw.kind("img", max_attempts=1)(p.handler)
    return p


async def test_a_manual_retry_takes_the_result_of_work_done_meanwhile(
    fw: Floodway, provider: Provider
) -> None:
    provider.fail_next = 1
    async with fw.worker():
        a = await fw.wait((await fw.submit("img", {"prompt": "chair"})).id, timeout=10)
        assert a.status is Status.DEAD
        c = await fw.wait((await fw.submit("img", {"prompt": "chair"})).id, timeout=10)
        assert c.status is Status.SUCCEEDED
        retried = await fw.retry(a.id)
        done = await fw.wait(a.id, timeout=10)
    assert retried.status is Status.DEDUPED
    assert done.status is Status.DEDUPED and done.duplicate_of == c.id
    assert done.result == c.result
    assert provider.total == 1  # the 503 was not billed; the retry made no call


async def test_a_manual_retry_waits_for_the_same_work_in_flight(
    fw: Floodway, provider: Provider
) -> None:
    provider.fail_next = 1
    async with fw.worker():
        a = await fw.wait((await fw.submit("img", {"prompt": "lamp"})).id, timeout=10)
        provider.hold.clear()
        provider.started.clear()
        c = await fw.submit("img", {"prompt": "lamp"})
        await asyncio.wait_for(provider.started.wait(), 10)
        retried = await fw.retry(a.id)
        assert retried.status is Status.QUEUED and retried.waits_for == c.id
        provider.hold.set()
        done = await fw.wait(a.id, timeout=10)
    assert done.status is Status.DEDUPED and done.duplicate_of == c.id
    assert provider.total == 1


async def test_a_deadline_mid_call_keeps_the_call_and_hands_its_result_to_the_waiter(
    fw: Floodway, clock: FakeClock, provider: Provider
) -> None:
    provider.hold.clear()
    async with fw.worker():
        a = await fw.submit("img", {"prompt": "sofa"}, deadline_s=1)
        await asyncio.wait_for(provider.started.wait(), 10)
        b = await fw.submit("img", {"prompt": "sofa"}, deadline_s=60)
        assert b.waits_for == a.id
        # the sweeper ends A at its deadline; its call goes on
        await _advance_until(clock, lambda: _has_status(fw, a.id, Status.TIMEOUT))
        await clock.advance(2)
        waiting = await fw.get(b.id)
        assert waiting.status is Status.QUEUED and waiting.waits_for == a.id
        assert provider.peak == 1  # B did not start a second call beside A's
        provider.hold.set()
        b_done = await fw.wait(b.id, timeout=10)
    a_done = await fw.get(a.id)
    assert b_done.status is Status.DEDUPED and b_done.result == a_done.result
    assert a_done.status is Status.TIMEOUT and a_done.result is not None  # kept, not wasted
    assert provider.total == 1 and provider.peak == 1
    assert a_done.lease_token is None  # the attempt was closed by its worker


async def test_a_failed_call_after_the_deadline_hands_the_work_over(
    fw: Floodway, clock: FakeClock, provider: Provider
) -> None:
    provider.hold.clear()
    provider.fail_next = 1
    async with fw.worker():
        await fw.submit("img", {"prompt": "rug"}, deadline_s=1)
        await asyncio.wait_for(provider.started.wait(), 10)
        b = await fw.submit("img", {"prompt": "rug"}, deadline_s=60)
        await clock.advance(2)
        assert (await fw.get(b.id)).status is Status.QUEUED
        provider.hold.set()
        b_done = await fw.wait(b.id, timeout=10)
    assert b_done.status is Status.SUCCEEDED  # it ran the work itself, once A's call ended
    assert provider.total == 1 and provider.peak == 1


async def test_cancelling_a_task_others_wait_for_lets_its_call_finish_for_them(
    fw: Floodway, provider: Provider
) -> None:
    provider.hold.clear()
    async with fw.worker():
        a = await fw.submit("img", {"prompt": "desk"})
        await asyncio.wait_for(provider.started.wait(), 10)
        b = await fw.submit("img", {"prompt": "desk"})
        cancelled = await fw.cancel(a.id)
        assert cancelled.status is Status.CANCELLED
        provider.hold.set()
        b_done = await fw.wait(b.id, timeout=10)
    assert b_done.status is Status.DEDUPED and provider.total == 1


async def test_cancelling_a_task_nobody_waits_for_stops_its_call(
    fw: Floodway, provider: Provider
) -> None:
    provider.hold.clear()
    async with fw.worker():
        a = await fw.submit("img", {"prompt": "vase"})
        await asyncio.wait_for(provider.started.wait(), 10)
        await fw.cancel(a.id)
        done = await fw.wait(a.id, timeout=10)
    assert done.status is Status.CANCELLED and provider.total == 0


async def test_tenants_never_share_work_unless_the_kind_says_so(fw: Floodway) -> None:
    private, shared = Provider(), Provider()
    fw.kind("portrait")(private.handler)
    fw.kind("stock", share="global")(shared.handler)
    async with fw.worker():
        mine = await fw.wait(
            (await fw.submit("portrait", {"prompt": "me"}, tenant="a")).id, timeout=10
        )
        theirs = await fw.wait(
            (await fw.submit("portrait", {"prompt": "me"}, tenant="b")).id, timeout=10
        )
        assert theirs.status is Status.SUCCEEDED and theirs.duplicate_of is None
        assert theirs.result != mine.result and private.total == 2
        first = await fw.wait(
            (await fw.submit("stock", {"prompt": "sky"}, tenant="a")).id, timeout=10
        )
        other = await fw.submit("stock", {"prompt": "sky"}, tenant="b")
    assert other.status is Status.DEDUPED and other.result == first.result
    assert other.duplicate_of is None  # another tenant's task id stays private
    assert [e.detail for e in await fw.store.events(other.id)][-1] == "result of shared work"
    assert shared.total == 1


async def test_a_waiter_lends_the_work_its_lane(fw: Floodway) -> None:
    order: list[str] = []
    gate = asyncio.Event()

    @fw.kind("img", resource=None)
    async def paint(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        order.append(value["prompt"])
        await gate.wait()
        return {"image": value["prompt"]}

    backlog = await fw.submit_many("img", [{"prompt": f"p{i}"} for i in range(20)])
    urgent = await fw.submit("img", {"prompt": "p15"}, lane="interactive")
    assert urgent.waits_for == backlog[15].id
    async with fw.worker(concurrency=1):
        gate.set()
        done = await fw.wait(urgent.id, timeout=10)
    assert done.status is Status.DEDUPED
    assert order.index("p15") == 0  # run first, as the interactive task alone would have


async def test_a_retry_is_refused_while_the_last_call_may_still_run(
    fw: Floodway, clock: FakeClock, provider: Provider
) -> None:
    """A worker died mid-call: its task failed (interrupted) at once, but the call may still
    be running at the provider until the kind's timeout: retrying now could pay twice."""
    await fw.open()
    task = await fw.submit("img", {"prompt": "orphan"})
    now = clock.now()
    (claimed,) = await fw.store.claim(
        ClaimParams("host:1:dead:w1", "tok", ("img",), 1, now, 30, ids=(task.id,))
    )
    interrupted = ErrorInfo(ErrorClass.INTERRUPTED, "worker_lost", "the worker died")
    item = changes.orphaned(claimed, Status.FAILED, interrupted, now + 60)
    assert (await fw.store.complete([item], now))[0].applied
    with pytest.raises(AttemptStillOpen) as refused:
        await fw.retry(task.id)
    assert refused.value.retry_after == pytest.approx(60)
    assert (await fw.get(task.id)).status is Status.FAILED  # nothing changed
    await clock.advance(61)  # the call has surely ended: a retry may run the work again
    assert (await fw.retry(task.id)).status is Status.QUEUED


async def test_request_keys_and_work_are_per_tenant(fw: Floodway, provider: Provider) -> None:
    await fw.open()
    a = await fw.submit_request(SubmitRequest("img", {"prompt": "hi"}, key="k"), tenant="a")
    b = await fw.submit_request(SubmitRequest("img", {"prompt": "hi"}, key="k"), tenant="b")
    assert not a.reused and not b.reused and a.task.id != b.task.id
    assert b.task.waits_for is None  # not waiting on another tenant's work


async def test_a_retry_after_a_late_success_takes_that_result(
    fw: Floodway, clock: FakeClock, provider: Provider
) -> None:
    """The task timed out mid-call and its call's late success was kept: the work is done, by
    this very task. Retrying it takes that result, without a call and without naming itself
    as its own duplicate."""
    provider.hold.clear()
    async with fw.worker():
        a = await fw.submit("img", {"prompt": "stool"}, deadline_s=1)
        await asyncio.wait_for(provider.started.wait(), 10)
        await _advance_until(clock, lambda: _has_status(fw, a.id, Status.TIMEOUT))
        provider.hold.set()
        await clock.advance(2)
        timed_out = await fw.wait(a.id, timeout=10)
        assert timed_out.status is Status.TIMEOUT and timed_out.result is not None
        retried = await fw.retry(a.id)
    assert retried.status is Status.DEDUPED and retried.result == timed_out.result
    assert retried.duplicate_of is None
    assert provider.total == 1


async def test_a_restart_holds_the_slot_of_a_dead_letters_call_still_running(
    db_url: str, clock: FakeClock
) -> None:
    """A process dies mid-call (the provider honours keys and goes on with the call); the next
    one finds the task out of attempts (dead) and dies in turn. The third must still count the
    call until it could have ended: cap 1, nothing starts beside it."""
    calls: list[float] = []  # when each call the provider took ends, whoever still listens
    peak = 0

    async def handler(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        nonlocal peak
        calls.append(clock.now() + 30)
        peak = max(peak, sum(1 for ends in calls if ends > clock.now()))
        await clock.sleep(30)
        return {"image": value["prompt"]}

    def process() -> Floodway:
        settings = Settings(database=db_url, resources={"api": {"concurrency": 1}})
        fw = Floodway(settings=settings, clock=clock)
        fw.kind("img", resource="api", max_attempts=1, idempotent=True, timeout=60)(handler)
        return fw

    first = process()
    async with AsyncExitStack() as alive:
        alive.push_async_callback(first.close)
        await alive.enter_async_context(first.worker(grace_s=0))
        task = await first.submit("img", {"prompt": "bench"})
        while not calls:
            await clock.advance(0.1)
        await sever(first)
    second = process()
    async with AsyncExitStack() as alive:
        alive.push_async_callback(second.close)
        # it reconciles the dead one's task as it starts
        await alive.enter_async_context(second.worker(grace_s=0))
        assert (await second.get(task.id)).status is Status.DEAD
        await sever(second)
    third = process()
    async with third, third.worker(grace_s=0):
        other = await third.submit("img", {"prompt": "lamp"})
        await clock.advance(5)  # the first call runs on at the provider
        assert (await third.get(other.id)).status is Status.QUEUED
        for _ in range(30):
            if (await third.get(other.id)).status is not Status.QUEUED:
                break
            await clock.advance(5)
        assert (await third.get(other.id)).status is not Status.QUEUED
    assert peak == 1 and len(calls) == 2
