"""The engine on the embedded default (SQLite), time driven by a fake clock."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from floodway import (
    AdmissionRefused,
    Context,
    FatalError,
    Floodway,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    RetryableError,
    Status,
    StoreError,
    Task,
    UnknownKind,
)
from floodway.config import ResourceConfig, Settings
from floodway.core.outcome import Completion
from floodway.core.task import ErrorClass, SubmitRequest
from floodway.maintenance.loop import Maintenance, Retainer
from floodway.maintenance.sweeper import Sweeper
from floodway.serving import serve_app
from floodway.store.base import ClaimParams
from floodway.testing import FakeClock, SimulatedProvider, settle
from floodway.worker.worker import Worker, WorkerOptions


async def wait_all(fw: Floodway, tasks: list[Task]) -> list[Task]:
    return [await fw.wait(t.id, timeout=30) for t in tasks]


async def test_submit_returns_at_once_and_worker_runs_it(fw: Floodway) -> None:
    sim = SimulatedProvider()
    fw.kind("img")(sim.handler)
    task = await fw.submit("img", {"prompt": "a cat"})
    assert task.status is Status.QUEUED and task.id.startswith("t_")
    async with fw.worker(concurrency=4):
        done = await fw.wait(task.id, timeout=10)
    assert done.status is Status.SUCCEEDED
    assert done.result["echo"] == {"prompt": "a cat"}
    assert done.attempts == 1 and done.finished_at is not None
    events = [e.status for e in await fw.store.events(task.id)]
    assert events == [Status.QUEUED, Status.RUNNING, Status.SUCCEEDED]


async def test_fifty_concurrent_duplicates_run_the_handler_once(fw: Floodway) -> None:
    calls = 0
    gate = asyncio.Event()

    @fw.kind("tts")
    async def speak(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        await gate.wait()
        return {"audio": value["text"][::-1], "key": ctx.work_key}

    async with fw.worker(concurrency=20):
        tasks = await asyncio.gather(*[fw.submit("tts", {"text": "hello"}) for _ in range(50)])
        await settle()
        gate.set()
        done = await wait_all(fw, tasks)
    assert calls == 1
    states = Counter(t.status for t in done)
    assert states == {Status.SUCCEEDED: 1, Status.DEDUPED: 49}
    primary = next(t for t in done if t.status is Status.SUCCEEDED)
    for t in done:
        assert t.result == primary.result
        if t.status is Status.DEDUPED:
            assert t.duplicate_of == primary.id


async def test_duplicate_after_success_is_deduped_without_a_call(fw: Floodway) -> None:
    sim = SimulatedProvider()
    fw.kind("img")(sim.handler)
    async with fw.worker():
        first = await fw.wait((await fw.submit("img", {"p": 1})).id, timeout=10)
    again = await fw.submit("img", {"p": 1})
    assert again.status is Status.DEDUPED and again.duplicate_of == first.id
    assert again.result == first.result and sim.calls == 1


async def test_waiter_runs_itself_when_the_primary_fails(fw: Floodway) -> None:
    outcomes = iter([FatalError("bad luck"), None])

    @fw.kind("img")
    async def flaky(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        exc = next(outcomes)
        if exc is not None:
            raise exc
        return {"ok": ctx.task_id}

    a = await fw.submit("img", {"p": 1})
    b = await fw.submit("img", {"p": 1})
    assert b.waits_for == a.id
    async with fw.worker(concurrency=1):
        a_done, b_done = await fw.wait(a.id, timeout=10), await fw.wait(b.id, timeout=10)
    assert a_done.status is Status.FAILED
    assert b_done.status is Status.SUCCEEDED and b_done.result == {"ok": b.id}


async def test_request_key_returns_the_same_task(fw: Floodway) -> None:
    fw.kind("img", dedupe=False)(SimulatedProvider().handler)
    first = await fw.submit_request(SubmitRequest("img", {"p": 1}, key="click-1"))
    second = await fw.submit_request(SubmitRequest("img", {"p": 1}, key="click-1"))
    assert not first.reused and second.reused and second.task.id == first.task.id
    with pytest.raises(IdempotencyConflict):
        await fw.submit("img", {"p": 2}, key="click-1")
    assert len(await fw.list_tasks()) == 1


async def test_request_keys_expire(fw: Floodway, clock: FakeClock) -> None:
    fw.kind("img", dedupe=False)(SimulatedProvider().handler)
    first = await fw.submit("img", {"p": 1}, key="k")
    await clock.advance(24 * 3600 + 1)
    second = await fw.submit("img", {"p": 1}, key="k")
    assert second.id != first.id


async def test_zombie_worker_cannot_write_its_stale_result(fw: Floodway, clock: FakeClock) -> None:
    fw.kind("img", idempotent=True)(SimulatedProvider().handler)
    task = await fw.submit("img", {"p": 1})
    await fw.open()
    store = fw.store
    zombie = (await store.claim(ClaimParams("zombie", "tok-z", ("img",), 1, clock.now(), 30)))[0]
    await clock.advance(31)  # the zombie's lease expires; the sweeper gives the task back
    assert (await Sweeper(fw.runtime).run_once()).recovered == 1
    await clock.advance(2)  # past the full-jitter backoff of a first retry (at most 1 s)
    fresh = (await store.claim(ClaimParams("w2", "tok-2", ("img",), 1, clock.now(), 30)))[0]
    assert fresh.id == task.id and fresh.attempts == 2
    late = Completion(
        task.id, Status.SUCCEEDED, Status.RUNNING, zombie.lease_token, result={"stale": True}
    )
    applied = await store.complete([late], clock.now())
    assert not applied[0].applied and applied[0].status is Status.RUNNING
    ok = Completion(
        task.id, Status.SUCCEEDED, Status.RUNNING, fresh.lease_token, result={"fresh": True}
    )
    assert (await store.complete([ok], clock.now()))[0].applied
    assert (await fw.get(task.id)).result == {"fresh": True}


async def test_heartbeat_reports_lost_lease_and_worker_fences(
    fw: Floodway, clock: FakeClock
) -> None:
    fw.kind("img")(SimulatedProvider().handler)
    task = await fw.submit("img", {"p": 1})
    await fw.open()
    claimed = (await fw.store.claim(ClaimParams("w", "tok", ("img",), 1, clock.now(), 30)))[0]
    await fw.store.complete(
        [Completion(task.id, Status.TIMEOUT, Status.RUNNING, "tok")], clock.now()
    )
    beat = await fw.store.heartbeat([(claimed.id, "tok")], clock.now(), 30)
    assert beat.lost == (task.id,)


async def test_retry_after_is_honoured_end_to_end(fw: Floodway, clock: FakeClock) -> None:
    attempts: list[float] = []

    @fw.kind("llm")
    async def busy(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        attempts.append(ctx.now())
        if len(attempts) == 1:
            raise RetryableError("503", retry_after=30)
        return {"ok": True}

    async with fw.worker():
        task = await fw.submit("llm", {"q": 1})
        await settle()
        assert (await fw.get(task.id)).status is Status.RETRYING
        await clock.advance(29)
        assert (await fw.get(task.id)).status is Status.RETRYING
        await clock.advance(2)
        done = await fw.wait(task.id, timeout=5)
    assert done.status is Status.SUCCEEDED and done.attempts == 2
    assert attempts[1] - attempts[0] >= 30


async def test_a_first_failure_with_nothing_else_waiting_is_retried_at_once(
    fw: Floodway, clock: FakeClock
) -> None:
    """Its backoff would only idle the free room; the second failure backs off."""
    attempts: list[float] = []

    @fw.kind("llm", max_attempts=4)
    async def flaky(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        attempts.append(ctx.now())
        if len(attempts) <= 2:
            raise RetryableError("503")
        return {"ok": True}

    async with fw.worker():
        task = await fw.submit("llm", {"q": 1})
        for _ in range(10):
            await settle()
        assert len(attempts) == 2 and attempts[1] == attempts[0]  # no time passed
        assert (await fw.get(task.id)).status is Status.RETRYING  # backing off now
        await clock.advance(5)  # past the second gap (full jitter, at most 4 s)
        done = await fw.wait(task.id, timeout=5)
    assert done.status is Status.SUCCEEDED and done.attempts == 3


async def _first_failure_beside(db_url: str, clock: FakeClock, tasks: int) -> list[float]:
    """Task 0 fails once while ``tasks - 1`` others are in flight or wait behind a cap of 3;
    the times its attempts started before any time passed (its retry may queue behind the
    waiting task for the slot it freed, so the others are let finish first)."""
    settings = Settings(database=db_url, resources={"p": ResourceConfig(concurrency=3)})
    fw = Floodway(settings=settings, clock=clock)
    gate = asyncio.Event()
    attempts: list[float] = []

    @fw.kind("llm", resource="p", max_attempts=4)
    async def call(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        if value["n"] == 0:
            attempts.append(ctx.now())
            if len(attempts) == 1:
                raise RetryableError("503")
        await gate.wait()
        return value

    async with fw:
        submitted = [await fw.submit("llm", {"n": n}) for n in range(tasks)]
        async with fw.worker(concurrency=10):
            for _ in range(5):
                await settle()
            gate.set()
            for _ in range(10):
                await settle()
            first_wave = list(attempts)
            await clock.advance(5)  # past any first backoff (full jitter, at most 0.5 s)
            done = await wait_all(fw, submitted)
    assert all(t.status is Status.SUCCEEDED for t in done)
    return first_wave


async def test_a_first_failure_in_the_last_wave_is_retried_at_once(
    db_url: str, clock: FakeClock
) -> None:
    """Three calls out, one task waiting: fewer wait than there are calls in flight, so they
    all start within a call's time, and a backoff would leave the freed room idle after."""
    attempts = await _first_failure_beside(db_url, clock, tasks=4)
    assert len(attempts) == 2 and attempts[1] == attempts[0]


async def test_a_first_failure_behind_a_queue_backs_off(db_url: str, clock: FakeClock) -> None:
    attempts = await _first_failure_beside(db_url, clock, tasks=12)
    assert len(attempts) == 1  # its retry waits for its backoff: nine others queue for a slot


async def test_exhausted_task_is_dead_and_the_alert_fires(fw: Floodway, clock: FakeClock) -> None:
    alerts: list[Task] = []
    fw.on_dead(alerts.append)

    @fw.kind("llm", max_attempts=3)
    async def always_busy(ctx: Context, value: dict[str, Any]) -> None:
        raise RetryableError("503 busy", retry_after=1)

    async with fw.worker():
        task = await fw.submit("llm", {"q": 1})
        for _ in range(5):
            await settle()
            await clock.advance(1.5)
        done = await fw.wait(task.id, timeout=5)
    assert done.status is Status.DEAD and done.attempts == 3
    assert done.error is not None and done.error.cls is ErrorClass.EXHAUSTED
    assert [t.id for t in alerts] == [task.id]


async def test_fatal_fails_at_once(fw: Floodway) -> None:
    @fw.kind("img")
    async def refuse(ctx: Context, value: dict[str, Any]) -> None:
        raise FatalError("content policy", type="content_policy")

    async with fw.worker():
        done = await fw.wait((await fw.submit("img", {"p": 1})).id, timeout=5)
    assert done.status is Status.FAILED and done.attempts == 1
    assert done.error is not None and done.error.type == "content_policy"


async def test_deadline_turns_queued_and_running_into_timeout(
    fw: Floodway, clock: FakeClock
) -> None:
    fw.kind("img")(SimulatedProvider().handler)
    queued = await fw.submit("img", {"p": 1}, deadline_s=10)
    await clock.advance(11)
    assert (await Sweeper(fw.runtime).run_once()).timed_out == 1
    done = await fw.get(queued.id)
    assert done.status is Status.TIMEOUT and done.error is not None
    assert done.error.cls is ErrorClass.TIMEOUT


async def test_poison_fails_and_submits_the_fallback(fw: Floodway, clock: FakeClock) -> None:
    fallback_ran = asyncio.Event()

    @fw.kind("cheap")
    async def cheap(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        fallback_ran.set()
        return {"url": "fallback"}

    schema = {"type": "object", "required": ["url"]}

    @fw.kind("fancy", output_schema=schema, fallback="cheap")
    async def fancy(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        return {"garbage": True}

    async with fw.worker():
        task = await fw.submit("fancy", {"p": 1})
        for _ in range(6):
            await settle()
            await clock.advance(10)
        done = await fw.wait(task.id, timeout=5)
        await asyncio.wait_for(fallback_ran.wait(), 5)
    assert done.status is Status.FAILED and done.attempts == 3
    assert done.error is not None and done.error.cls is ErrorClass.POISON
    follow = [t for t in await fw.list_tasks() if t.kind == "cheap"]
    assert follow and follow[0].metadata["fallback_of"] == task.id


async def test_cancel_queued_at_once_and_running_via_signal(fw: Floodway) -> None:
    started = asyncio.Event()
    saw_cancel = asyncio.Event()

    @fw.kind("video")
    async def render(ctx: Context, value: dict[str, Any]) -> None:
        started.set()
        await ctx.cancelled.wait()
        saw_cancel.set()
        await asyncio.Event().wait()

    queued = await fw.submit("video", {"n": 1}, lane="background")
    assert (await fw.cancel(queued.id)).status is Status.CANCELLED
    with pytest.raises(IllegalTransition):
        await fw.cancel(queued.id)
    async with fw.worker():
        running = await fw.submit("video", {"n": 2})
        await asyncio.wait_for(started.wait(), 5)
        await fw.cancel(running.id)
        done = await fw.wait(running.id, timeout=5)
    assert saw_cancel.is_set() and done.status is Status.CANCELLED


async def test_interactive_runs_before_background(fw: Floodway) -> None:
    order: list[str] = []

    @fw.kind("llm", dedupe=False)
    async def note(ctx: Context, value: dict[str, Any]) -> None:
        order.append(value["lane"])

    bg = [await fw.submit("llm", {"lane": "bg"}) for _ in range(5)]
    it = [await fw.submit("llm", {"lane": "it"}, lane="interactive") for _ in range(3)]
    async with fw.worker(concurrency=1):
        await wait_all(fw, bg + it)
    assert order == ["it"] * 3 + ["bg"] * 5


async def test_interactive_depth_says_too_fast(fw: Floodway) -> None:
    fw.kind("llm", dedupe=False)(SimulatedProvider().handler)
    for i in range(5):
        await fw.submit("llm", {"i": i}, lane="interactive", tenant="alice")
    with pytest.raises(AdmissionRefused, match="too fast") as info:
        await fw.submit("llm", {"i": 9}, lane="interactive", tenant="alice")
    assert info.value.limit == "interactive_depth" and info.value.retry_after > 0
    await fw.submit("llm", {"i": 9}, lane="interactive", tenant="bob")  # per tenant
    await fw.submit("llm", {"i": 9}, lane="background", tenant="alice")  # per lane
    assert len(await fw.list_tasks()) == 7


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("kind", "value", "error"),
    [
        ("nope", {"a": 1}, UnknownKind),
        ("img", "not an object", InvalidInput),
        ("img", {"a": float("nan")}, InvalidInput),
        ("img", {"a": [1, float("-inf")]}, InvalidInput),
        ("img", {"a": object()}, InvalidInput),
        ("img", {"a": {1, 2}}, InvalidInput),
        ("img", {"a": (1, 2)}, InvalidInput),
        ("img", {"a": b"bytes"}, InvalidInput),
        ("img", {"a": {1: "int key"}}, InvalidInput),
        ("img", {"a": _nested(40)}, InvalidInput),
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(
    fw: Floodway, kind: str, value: Any, error: type[Exception]
) -> None:
    fw.kind("img")(SimulatedProvider().handler)
    with pytest.raises(error):
        await fw.submit(kind, value)
    assert await fw.list_tasks() == []


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"max_attempts": 1001},
        {"max_attempts": True},
        {"deadline_s": 0},
        {"deadline_s": -1.0},
        {"deadline_s": float("inf")},
        {"deadline_s": float("nan")},
        {"deadline_s": 366 * 86400.0 + 1},
        {"metadata": {"a": object()}},
    ],
)
async def test_the_library_refuses_what_the_api_refuses(
    fw: Floodway, options: dict[str, Any]
) -> None:
    fw.kind("img")(SimulatedProvider().handler)
    with pytest.raises(InvalidInput):
        await fw.submit("img", {"a": 1}, **options)
    with pytest.raises(InvalidInput):
        await fw.submit_many(
            "img",
            [{"a": 1}, {"a": 2}],
            **{k: v for k, v in options.items() if k != "metadata"} or {"max_attempts": 0},
        )
    assert await fw.list_tasks() == []


async def test_illegal_manual_retry_raises_and_changes_nothing(fw: Floodway) -> None:
    fw.kind("img")(SimulatedProvider().handler)
    task = await fw.submit("img", {"p": 1})
    with pytest.raises(IllegalTransition, match="the task is queued: nothing to retry"):
        await fw.retry(task.id)
    assert (await fw.get(task.id)).status is Status.QUEUED


async def test_manual_retry_gives_a_dead_letter_a_fresh_budget(fw: Floodway) -> None:
    fail = True

    @fw.kind("img", max_attempts=1)
    async def once(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        if fail:
            raise RetryableError("503")
        return {"ok": 1}

    async with fw.worker():
        task = await fw.submit("img", {"p": 1})
        assert (await fw.wait(task.id, timeout=5)).status is Status.DEAD
        fail = False
        retried = await fw.retry(task.id)
        assert retried.status is Status.QUEUED and retried.attempts == 0
        assert (await fw.wait(task.id, timeout=5)).status is Status.SUCCEEDED


async def test_database_that_cannot_be_opened(tmp_path: Path) -> None:
    fw = Floodway(database=f"sqlite:///{tmp_path}/missing/dir/x.db")
    with pytest.raises(StoreError, match="does not exist"):
        await fw.open()
    with pytest.raises(StoreError, match="unsupported database URL"):
        await Floodway(database="mysql://nope").open()


async def test_recovery_reconciles_by_lookup_resubmit_or_interrupt(
    fw: Floodway, clock: FakeClock
) -> None:
    sim = SimulatedProvider()
    fw.kind("found", lookup=sim.lookup)(sim.handler)
    fw.kind("safe", idempotent=True)(sim.handler)
    fw.kind("unsafe")(sim.handler)
    await fw.open()
    found = await fw.submit("found", {"p": 1})
    safe = await fw.submit("safe", {"p": 2})
    unsafe = await fw.submit("unsafe", {"p": 3})
    claimed = await fw.store.claim(
        ClaimParams("dead", "tok", ("found", "safe", "unsafe"), 10, clock.now(), 30)
    )
    assert len(claimed) == 3
    sim.results[found.work_key] = {"from": "upstream"}  # the provider finished before we died
    await clock.advance(31)
    await Sweeper(fw.runtime).run_once()
    assert (await fw.get(found.id)).status is Status.SUCCEEDED
    assert (await fw.get(found.id)).result == {"from": "upstream"}
    assert (await fw.get(safe.id)).status is Status.RETRYING
    lost = await fw.get(unsafe.id)
    assert lost.status is Status.FAILED and lost.error is not None
    assert lost.error.cls is ErrorClass.INTERRUPTED


async def test_retention_clears_results_then_rows_then_keys(fw: Floodway, clock: FakeClock) -> None:
    fw.kind("img")(SimulatedProvider().handler)
    async with fw.worker():
        task = await fw.wait((await fw.submit("img", {"p": 1}, key="k1")).id, timeout=5)
    retainer = Retainer(fw.runtime)  # the defaults: results 7 d, rows 30 d, keys 24 h
    await clock.advance(8 * 86400)
    purged = await retainer.run_once()
    assert purged.results_cleared == 1 and purged.keys_expired == 1
    assert (await fw.get(task.id)).result is None
    again = await fw.submit("img", {"p": 1})  # the result expired: not deduped any more
    assert again.status is Status.QUEUED
    await clock.advance(23 * 86400)
    assert (await retainer.run_once()).rows_deleted == 1


async def test_graceful_stop_releases_without_spending_an_attempt(fw: Floodway) -> None:
    """Past its grace, a stop hangs up on the call: to a provider that honours the key the
    task goes back to the queue (its resend joins the call), no attempt spent."""
    started = asyncio.Event()

    @fw.kind("video", idempotent=True)
    async def long(ctx: Context, value: dict[str, Any]) -> None:
        started.set()
        await asyncio.Event().wait()

    task = await fw.submit("video", {"n": 1})
    async with fw.worker(grace_s=0.05):
        await asyncio.wait_for(started.wait(), 5)
    after = await fw.get(task.id)
    assert after.status is Status.RETRYING and after.attempts == 0


async def test_graceful_stop_never_resends_to_a_provider_without_keys(fw: Floodway) -> None:
    """The same stop, to a provider that would bill a resend again: the task fails, its
    billing unknown, and its attempt stays open (slot and spend held) until the call could
    have ended."""
    started = asyncio.Event()

    @fw.kind("video", timeout=30.0)
    async def long(ctx: Context, value: dict[str, Any]) -> None:
        started.set()
        await asyncio.Event().wait()

    task = await fw.submit("video", {"n": 1})
    async with fw.worker(grace_s=0.05):
        await asyncio.wait_for(started.wait(), 5)
    after = await fw.get(task.id)
    assert after.status is Status.FAILED and after.error is not None
    assert "billing unknown" in after.error.message
    assert after.lease_token is not None and after.lease_owner is None


async def test_only_one_maintenance_leader(fw: Floodway, clock: FakeClock) -> None:
    await fw.open()
    a, b = Maintenance(fw.runtime), Maintenance(fw.runtime)
    assert await a.tick() and not await b.tick()
    await clock.advance(60)  # a stopped renewing: b takes over
    assert await b.tick() and not await a.tick()


async def test_submits_from_another_process_wake_the_dispatcher(db_url: str) -> None:
    """A second Floodway on the same file stands in for another process (its own
    connections); the worker's idle wait must notice without a local wake-up."""
    worker_side = Floodway(database=db_url)
    submit_side = Floodway(database=db_url)
    sim = SimulatedProvider()
    worker_side.kind("img")(sim.handler)
    submit_side.kind("img")(sim.handler)
    try:
        async with worker_side.worker():
            task = await submit_side.submit("img", {"p": 1})
            done = await submit_side.wait(task.id, timeout=10)
        assert done.status is Status.SUCCEEDED
    finally:
        await worker_side.close()
        await submit_side.close()


async def test_dead_letter_alert_url_gets_a_post(db_url: str, clock: FakeClock) -> None:
    received: list[dict[str, Any]] = []
    got = asyncio.Event()
    receiver = FastAPI()

    @receiver.post("/alerts")
    async def alert(request: Request) -> dict[str, bool]:
        received.append(await request.json())
        got.set()
        return {"ok": True}

    async with serve_app(receiver) as url:
        fw = Floodway(settings=Settings(database=db_url, alert_url=f"{url}/alerts"), clock=clock)

        @fw.kind("llm", max_attempts=1)
        async def busy(ctx: Context, value: dict[str, Any]) -> None:
            raise RetryableError("503 busy")

        try:
            async with fw.worker():
                task = await fw.submit("llm", {"q": 1})
                assert (await fw.wait(task.id, timeout=5)).status is Status.DEAD
                await asyncio.wait_for(got.wait(), 10)
        finally:
            await fw.close()
    assert received[0]["event"] == "task.dead" and received[0]["task_id"] == task.id
    assert received[0]["error"]["class"] == "exhausted"


async def test_a_claimed_task_keeps_its_provider_slot_past_the_claim_ttl(
    db_url: str, clock: FakeClock
) -> None:
    """A slot taken at admission lasts the claim TTL (10 s); the claim confirms it for as long
    as the task runs, heartbeats or not."""
    settings = Settings(database=db_url, resources={"p": ResourceConfig(concurrency=1)})
    fw = Floodway(settings=settings, clock=clock)
    gate = asyncio.Event()

    @fw.kind("slow", resource="p")
    async def slow(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return value

    async with fw:
        a, b = await fw.submit("slow", {"n": 1}), await fw.submit("slow", {"n": 2})
        # No heartbeat in this test's span: only the claim's confirmation holds the slot.
        worker = Worker(fw.runtime, WorkerOptions(concurrency=2, heartbeat_s=3600, lease_s=7200))
        await worker.start()
        try:
            await settle()
            await clock.advance(30)  # past the claim TTL, within the kind's timeout
            await settle()
            statuses = [(await fw.get(t.id)).status for t in (a, b)]
            assert statuses == [Status.RUNNING, Status.QUEUED]  # the cap of 1 still holds
            gate.set()
            done = await wait_all(fw, [a, b])
        finally:
            await worker.stop()
    assert [t.status for t in done] == [Status.SUCCEEDED, Status.SUCCEEDED]
