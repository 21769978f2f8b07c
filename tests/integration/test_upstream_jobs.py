"""Async upstream jobs end to end: a Floodway with workers, the simulator over HTTP, and (for
webhooks) a callback receiver on loopback. Counts, not timings, are asserted."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response

from floodway import Context, ErrorClass, Floodway, Parked, Settings, Status, Task
from floodway.core.backoff import Backoff
from floodway.core.retry import RetryPolicy
from floodway.providers.registry import aclose_kinds
from floodway.providers.sim import SimulatorConfig, running_simulator, serve_app
from floodway.store.base import TaskQuery
from floodway.testing import FakeClock
from floodway.wire.signing import WebhookSignatureError, sign, verify
from floodway.worker.callbacks import Applied, apply_callback
from tests.integration.conftest import eventually

SCHEMA = {"type": "object", "required": ["url"]}


@asynccontextmanager
async def floodway_with(db_url: str, kinds: dict[str, Any]) -> AsyncIterator[Floodway]:
    # Quick retries: the tests count attempts, they do not wait for realistic backoff.
    fw = Floodway(
        settings=Settings(database=db_url, kinds=kinds),
        policy=RetryPolicy(backoff=Backoff(base_s=0.02, cap_s=0.1)),
    )
    try:
        async with fw:
            yield fw
    finally:
        await aclose_kinds(fw.kinds)


async def wait_all(fw: Floodway, tasks: list[Task], timeout: float = 60) -> list[Task]:
    return [await fw.wait(t.id, timeout=timeout) for t in tasks]


async def test_twenty_async_jobs_complete_with_few_polls_and_free_worker_slots(
    db_url: str,
) -> None:
    config = SimulatorConfig(async_jobs=True, job_duration_ms=300, latency_jitter=1 / 3, seed=11)
    async with running_simulator(config) as sim:
        kinds = {"gen": {"adapter": "simulated", "url": sim.url, "poll_after": "200ms"}}
        async with floodway_with(db_url, kinds) as fw, fw.worker(concurrency=4):
            tasks = await fw.submit_many("gen", [{"n": i} for i in range(20)])
            done = await wait_all(fw, tasks)
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 20}
    assert all(t.result["echo"] == {"n": i} for i, t in enumerate(done))
    assert all(t.cost_actual is not None and t.upstream_ref for t in done)
    assert sim.state.stats.polls / 20 <= 6
    # Parked tasks hold no worker slot: far more jobs ran upstream at once than 4 workers.
    assert sim.state.stats.peak_concurrency > 4
    assert sim.state.ledger.total == 20 and sim.state.ledger.as_dict()["double_charged"] == []


async def test_a_parked_task_keeps_its_provider_slot_until_its_job_ends(db_url: str) -> None:
    # The provider is still working while a task is parked: a resource of 3 slots must never
    # see a 4th job, although 10 workers are free; and every slot comes back at the end.
    config = SimulatorConfig(async_jobs=True, job_duration_ms=150, latency_jitter=0.3, seed=2)
    async with running_simulator(config) as sim:
        fw = Floodway(
            settings=Settings(
                database=db_url,
                resources={"gpu": {"concurrency": 3}},
                kinds={
                    "gen": {
                        "adapter": "simulated",
                        "url": sim.url,
                        "resource": "gpu",
                        "poll_after": "100ms",
                    }
                },
            )
        )
        try:
            async with fw, fw.worker(concurrency=10):
                tasks = await fw.submit_many("gen", [{"n": i} for i in range(12)])
                done = await wait_all(fw, tasks)
        finally:
            await aclose_kinds(fw.kinds)
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 12}
    assert sim.state.stats.peak_concurrency <= 3
    assert sim.state.stats.rate_limited == 0


async def test_webhooks_with_a_fifth_of_callbacks_dropped_still_complete_everything(
    db_url: str,
) -> None:
    secret = "whk-test-secret"
    config = SimulatorConfig(
        async_jobs=True,
        job_duration_ms=300,
        latency_jitter=1 / 3,
        webhook=True,
        webhook_drop_rate=0.2,
        webhook_secret=secret,
        seed=5,
    )
    holder: dict[str, Floodway] = {}
    applied: list[bool] = []
    receiver = FastAPI()

    @receiver.post("/hooks/{kind}")
    async def hook(kind: str, request: Request) -> Response:
        body = await request.body()
        try:
            verify(secret, request.headers, body, time.time())
        except WebhookSignatureError:
            return Response(status_code=401)
        applied.append((await apply_callback(holder["fw"].runtime, kind, json.loads(body))).applied)
        return Response(status_code=204)

    async with running_simulator(config) as sim, serve_app(receiver) as hooks:
        kinds = {
            "gen": {
                "adapter": "simulated",
                "url": sim.url,
                "webhook_secret": secret,
                "callback_grace": "1s",  # polling is only the fallback for lost callbacks
                "options": {"callback_url": f"{hooks}/hooks/{{kind}}"},
            }
        }
        async with floodway_with(db_url, kinds) as fw, fw.worker(concurrency=10) as worker:
            holder["fw"] = fw
            tasks = await fw.submit_many("gen", [{"n": i} for i in range(30)])
            done = await wait_all(fw, tasks)
            polls = worker.poller.polls
    stats = sim.state.stats
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 30}
    assert stats.webhooks_dropped >= 1 and sum(applied) >= 1
    assert sum(applied) + polls >= 30  # each task was finished by its callback or by a poll
    assert polls >= stats.webhooks_dropped
    assert polls / len(done) < 1  # webhooks first: polling only finds the lost callbacks
    assert all(t.cost_actual is not None for t in done)
    assert sim.state.ledger.total == 30 and sim.state.ledger.as_dict()["double_charged"] == []


async def test_webhook_and_poll_race_lands_exactly_one_terminal_write(db_url: str) -> None:
    """Callbacks and polls for the same jobs: the callbacks of even-numbered tasks are held
    back until the poller has ended their tasks (the poll wins, the callback must change
    nothing; a fixed 1 s delay lost that race on a slow machine); the others are applied at
    once, before the first poll is due (the callback wins, the poll finds the task gone).
    Whatever lands in between races for real."""
    secret = "race"
    config = SimulatorConfig(
        async_jobs=True,
        job_duration_ms=100,
        latency_jitter=0.5,
        webhook=True,
        webhook_secret=secret,
    )
    holder: dict[str, Floodway] = {}
    by_callback: dict[int, bool] = {}
    receiver = FastAPI()

    @receiver.post("/hooks/{kind}")
    async def hook(kind: str, request: Request) -> Response:
        payload = json.loads(await request.body())
        n = payload["result"]["echo"]["n"]
        if n % 2 == 0:  # held back until the poll has ended its task (bounded)
            async with asyncio.timeout(30):
                while True:
                    task = await holder["fw"].store.find_upstream(kind, payload["id"])
                    if task is not None and task.terminal:
                        break
                    await asyncio.sleep(0.01)
        by_callback[n] = (await apply_callback(holder["fw"].runtime, kind, payload)).applied
        return Response(status_code=204)

    async with running_simulator(config) as sim, serve_app(receiver) as hooks:
        kinds = {
            "gen": {
                "adapter": "simulated",
                "url": sim.url,
                "webhook_secret": secret,
                "callback_grace": "400ms",
                "options": {"callback_url": f"{hooks}/hooks/gen"},
            }
        }
        async with floodway_with(db_url, kinds) as fw, fw.worker(concurrency=10):
            holder["fw"] = fw
            tasks = await fw.submit_many("gen", [{"n": i} for i in range(30)])
            done = await wait_all(fw, tasks)
            while len(by_callback) < 30:  # the held-back callbacks still arrive
                await fw.clock.sleep(0.01)
            events = [await fw.store.events(t.id) for t in tasks]
            late = {"id": done[0].upstream_ref, "status": "succeeded", "result": {"url": "late"}}
            assert not (await apply_callback(fw.runtime, "gen", late)).applied  # already ended
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 30}
    assert not any(won for n, won in by_callback.items() if n % 2 == 0)  # polls won these
    assert any(won for n, won in by_callback.items() if n % 2 == 1)
    for history in events:  # exactly one terminal write per task, whoever won
        assert [e.status for e in history].count(Status.SUCCEEDED) == 1
    assert sim.state.ledger.as_dict()["double_charged"] == []


async def test_invalid_output_three_times_is_poison_and_the_fallback_runs(db_url: str) -> None:
    bad = SimulatorConfig(latency_ms=5, malformed_rate=1.0, seed=1)
    good = SimulatorConfig(latency_ms=5, seed=2)
    async with running_simulator(bad) as bad_sim, running_simulator(good) as good_sim:
        kinds = {
            "strict": {
                "adapter": "simulated",
                "url": bad_sim.url,
                "output_schema": SCHEMA,
                "fallback": "backup",
                "max_attempts": 6,
            },
            "backup": {"adapter": "simulated", "url": good_sim.url, "output_schema": SCHEMA},
        }
        async with floodway_with(db_url, kinds) as fw, fw.worker(concurrency=4):
            task = await fw.submit("strict", {"prompt": "a dog"})
            failed = await fw.wait(task.id, timeout=30)
            fallback = await _fallback_of(fw, task.id)
            rescued = await fw.wait(fallback.id, timeout=30)
    assert failed.status is Status.FAILED
    assert failed.error is not None and failed.error.cls is ErrorClass.POISON
    assert failed.attempts == 3 and failed.invalid_outputs == 3
    assert rescued.status is Status.SUCCEEDED and rescued.input == {"prompt": "a dog"}
    # The same Idempotency-Key each attempt: the bad provider billed the work once.
    assert bad_sim.state.ledger.total == 1


async def test_a_fallback_past_the_tenant_s_budget_is_not_submitted_and_work_goes_on(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    bad = SimulatorConfig(latency_ms=5, malformed_rate=1.0, seed=1)
    async with running_simulator(bad) as sim:
        kinds = {
            "strict": {
                "adapter": "simulated",
                "url": sim.url,
                "output_schema": SCHEMA,
                "fallback": "backup",
            },
            "backup": {"adapter": "simulated", "url": sim.url, "price": {"per_request": 1.0}},
        }
        fw = Floodway(
            settings=Settings(database=db_url, kinds=kinds, tenants={"budget": {"amount": 0.5}}),
            policy=RetryPolicy(backoff=Backoff(base_s=0.02, cap_s=0.1)),
        )
        async with fw, fw.worker(concurrency=2):
            first = await fw.wait((await fw.submit("strict", {"n": 1})).id, timeout=30)
            second = await fw.wait((await fw.submit("strict", {"n": 2})).id, timeout=30)

            async def refused() -> bool:  # the outbox submits a fallback after the write
                return "fallback of " + first.id + " not submitted" in caplog.text

            await eventually(refused)
        await aclose_kinds(fw.kinds)
    assert first.status is second.status is Status.FAILED  # the worker went on after the first
    assert "fallback of " + first.id + " not submitted" in caplog.text
    assert "budget" in caplog.text


async def test_invalid_output_of_an_async_job_is_poison_too(db_url: str) -> None:
    bad = SimulatorConfig(async_jobs=True, job_duration_ms=50, malformed_rate=1.0, seed=1)
    async with running_simulator(bad) as sim:
        kinds = {
            "strict": {
                "adapter": "simulated",
                "url": sim.url,
                "output_schema": SCHEMA,
                "poll_after": "50ms",
            }
        }
        async with floodway_with(db_url, kinds) as fw, fw.worker(concurrency=2):
            task = await fw.submit("strict", {"prompt": "a dog"})
            failed = await fw.wait(task.id, timeout=30)
    assert failed.status is Status.FAILED
    assert failed.error is not None and failed.error.cls is ErrorClass.POISON
    assert failed.invalid_outputs == 3
    assert sim.state.stats.jobs_submitted == 1 and sim.state.ledger.total == 1


async def _fallback_of(fw: Floodway, task_id: str) -> Task:
    # Submitted right after the poison write lands, so wait() may return just before it.
    for _ in range(500):
        for task in await fw.list_tasks(TaskQuery(kind="backup")):
            if task.metadata.get("fallback_of") == task_id:
                return task
        await fw.clock.sleep(0.01)
    raise AssertionError("no fallback task was submitted")


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"poll_max_attempts": 3}, "poll_limit"),
        ({"deadline": "800ms", "poll_max_attempts": 1000}, "deadline"),
    ],
)
async def test_a_job_that_never_ends_times_out_and_is_cancelled_upstream(
    db_url: str, limits: dict[str, Any], reason: str
) -> None:
    config = SimulatorConfig(async_jobs=True, job_duration_ms=30_000, latency_jitter=0)
    async with running_simulator(config) as sim:
        kinds = {
            "gen": {
                "adapter": "simulated",
                "url": sim.url,
                "poll_after": "50ms",
                "options": {"poll_max_interval": "100ms"},
                **limits,
            }
        }
        async with floodway_with(db_url, kinds) as fw, fw.worker(concurrency=2):
            task = await fw.submit("gen", {"n": 1})
            ended = await fw.wait(task.id, timeout=30)
    assert ended.status is Status.TIMEOUT
    assert ended.error is not None and ended.error.type == reason
    assert sim.state.stats.cancelled == 1
    if reason == "poll_limit":
        assert sim.state.stats.polls == 3


async def test_cancelling_a_parked_task_cancels_the_upstream_job_at_once(db_url: str) -> None:
    config = SimulatorConfig(async_jobs=True, job_duration_ms=300_000, latency_jitter=0)
    async with running_simulator(config) as sim:
        # The first poll is a minute away: the cancel must not wait for it.
        kinds = {"gen": {"adapter": "simulated", "url": sim.url, "poll_after": "60s"}}
        async with floodway_with(db_url, kinds) as fw, fw.worker(concurrency=2):
            task = await fw.submit("gen", {"n": 1})
            while not (await fw.get(task.id)).parked:
                await fw.clock.sleep(0.01)
            await fw.cancel(task.id)
            ended = await fw.wait(task.id, timeout=20)
    assert ended.status is Status.CANCELLED
    assert sim.state.stats.cancelled == 1
    assert sim.state.stats.polls == 0


async def test_a_cancel_while_a_poll_is_out_cancels_the_upstream_job_and_frees_its_slot(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The poller holds the task's lease while it polls, so the cancel ends the task at once;
    # the job still runs upstream, and the provider can stop it: it must be asked to.
    config = SimulatorConfig(async_jobs=True, job_duration_ms=300_000, latency_jitter=0)
    async with running_simulator(config) as sim:
        kinds = {"gen": {"adapter": "simulated", "url": sim.url, "poll_after": "50ms"}}
        settings = Settings(database=db_url, kinds=kinds, resources={"gpu": {"concurrency": 1}})
        kinds["gen"]["resource"] = "gpu"
        fw = Floodway(settings=settings)
        async with fw, fw.worker(concurrency=2):
            poller = fw.kinds.get("gen").poll
            assert poller is not None
            look = type(poller).poll
            polling, answer = asyncio.Event(), asyncio.Event()

            async def held_poll(self: Any, ctx: Context, ref: str) -> tuple[str, Any]:
                polling.set()
                await answer.wait()
                return await look(self, ctx, ref)

            monkeypatch.setattr(type(poller), "poll", held_poll)
            task = await fw.submit("gen", {"n": 1})
            await asyncio.wait_for(polling.wait(), 20)
            await fw.cancel(task.id)
            answer.set()
            assert (await fw.wait(task.id, timeout=20)).status is Status.CANCELLED

            async def stopped() -> bool:
                return sim.state.stats.cancelled == 1

            await eventually(stopped)
            # The job was stopped: its slot is free for the next task now, not when a lease or
            # a hold lapses.
            monkeypatch.setattr(type(poller), "poll", look)
            nxt = await fw.submit("gen", {"n": 2})

            async def sent() -> bool:
                return sim.state.stats.jobs_submitted == 2

            await eventually(sent, timeout=5)
            assert (await fw.get(nxt.id)).status is Status.RUNNING
        await aclose_kinds(fw.kinds)


async def test_a_failed_job_is_submitted_again_by_the_next_attempt(db_url: str) -> None:
    config = SimulatorConfig(async_jobs=True, job_duration_ms=50, error_rate=0.5, seed=4)
    async with running_simulator(config) as sim:
        kinds = {
            "gen": {"adapter": "simulated", "url": sim.url, "poll_after": "50ms", "max_attempts": 8}
        }
        async with floodway_with(db_url, kinds) as fw, fw.worker(concurrency=4):
            tasks = await fw.submit_many("gen", [{"n": i} for i in range(10)])
            done = await wait_all(fw, tasks)
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 10}
    assert sim.state.stats.errors_5xx >= 1  # some jobs failed upstream and were redone
    assert sim.state.ledger.total == 10  # failed jobs are refunded: each task billed once


@pytest.mark.parametrize("end", ["cancel", "cancel_mid_poll", "poll_deadline", "sweeper_deadline"])
async def test_a_job_given_up_on_keeps_its_provider_slot_while_it_may_run(
    db_url: str, clock: FakeClock, end: str
) -> None:
    """A parked task ends (cancelled while parked or while a poll is out, or past its deadline)
    but its provider cannot be asked to stop the job: the job goes on at the provider, so its
    slot must stay taken. Cap 1: the next task may not start beside it."""
    fw = Floodway(
        settings=Settings(database=db_url, resources={"gpu": {"concurrency": 1}}), clock=clock
    )
    jobs: dict[str, float] = {}  # job -> when the provider finishes it
    peak = 0

    def running() -> int:
        return sum(1 for ends in jobs.values() if ends > clock.now())

    polling, answer = asyncio.Event(), asyncio.Event()

    async def poll(ctx: Context, ref: str) -> tuple[str, Any]:
        if end == "cancel_mid_poll" and not answer.is_set():
            polling.set()
            await answer.wait()  # the cancel lands while this poll is out
        return ("done", {"job": ref}) if jobs[ref] <= clock.now() else ("running", None)

    # a poll at the deadline itself (the poller gives up) or long after it (the sweeper does)
    first_poll = 1.0 if end in ("poll_deadline", "cancel_mid_poll") else 100.0

    @fw.kind("gen", resource="gpu", deadline=None, timeout=40, poll=poll, poll_after=first_poll)
    async def gen(ctx: Context, value: Any) -> Parked:
        nonlocal peak
        jobs[ctx.work_key] = clock.now() + 30  # no way to cancel it: it runs its 30 s
        peak = max(peak, running())
        await ctx.set_upstream_ref(ctx.work_key)
        return Parked(ctx.work_key, clock.now() + first_poll)

    deadline = None if end == "cancel" else 3.0
    async with fw, fw.worker():
        first = await fw.submit("gen", {"n": 1}, deadline_s=deadline)
        while not (await fw.get(first.id)).parked:
            await clock.advance(0.1)
        if end == "cancel":
            await fw.cancel(first.id)
        if end == "cancel_mid_poll":
            while not polling.is_set():
                await clock.advance(0.1)
            await fw.cancel(first.id)
            answer.set()
        await clock.advance(5)
        ended = await fw.get(first.id)
        assert ended.status is (Status.TIMEOUT if "deadline" in end else Status.CANCELLED)
        second = await fw.submit("gen", {"n": 2})
        await clock.advance(5)  # the first job still runs at the provider
        assert (await fw.get(second.id)).status is Status.QUEUED
        assert peak == 1
        for _ in range(20):  # until the held slot lapses (the kind's timeout) and the second
            # task gets it
            if (await fw.get(second.id)).status is not Status.QUEUED:
                break
            await clock.advance(5)
        assert (await fw.get(second.id)).parked
    assert peak == 1 and len(jobs) == 2


@pytest.mark.parametrize("before", ["parked", "cancelled", "past_deadline"])
async def test_a_restart_holds_the_slots_of_jobs_still_running_upstream(
    db_url: str, clock: FakeClock, before: str
) -> None:
    """The embedded default's limits live in the process. A process dies while an upstream job
    it started runs at the provider (its task parked, or ended by a cancel or by its deadline,
    the job not stoppable); the process started in its place must count that job. Cap 1:
    nothing starts beside it."""
    jobs: dict[str, float] = {}  # job -> when the provider finishes it
    peak = 0
    first_poll = 100.0 if before == "past_deadline" else 5.0  # the sweeper ends it, no poll

    def running() -> int:
        return sum(1 for ends in jobs.values() if ends > clock.now())

    def app() -> Floodway:
        fw = Floodway(
            settings=Settings(database=db_url, resources={"gpu": {"concurrency": 1}}), clock=clock
        )

        async def poll(ctx: Context, ref: str) -> tuple[str, Any]:
            return ("done", {"job": ref}) if jobs[ref] <= clock.now() else ("running", None)

        @fw.kind("gen", resource="gpu", deadline=None, timeout=40, poll=poll, poll_after=5)
        async def gen(ctx: Context, value: Any) -> Parked:
            nonlocal peak
            jobs.setdefault(ctx.work_key, clock.now() + 30)  # it cannot be cancelled
            peak = max(peak, running())
            await ctx.set_upstream_ref(ctx.work_key)
            return Parked(ctx.work_key, clock.now() + first_poll)

        return fw

    first = app()
    async with AsyncExitStack() as process:
        process.push_async_callback(first.close)
        await process.enter_async_context(first.worker())
        deadline = 3.0 if before == "past_deadline" else None
        task = await first.submit("gen", {"n": 1}, deadline_s=deadline)
        while not (await first.get(task.id)).parked:
            await clock.advance(0.1)
        if before == "cancelled":
            await first.cancel(task.id)
        await clock.advance(5 if deadline else 1)
        ended = {"cancelled": Status.CANCELLED, "past_deadline": Status.TIMEOUT}
        assert (await first.get(task.id)).status is ended.get(before, Status.RUNNING)
        await first.store.close()  # killed: nothing more of it reaches the ledger
    second = app()
    async with second, second.worker():
        other = await second.submit("gen", {"n": 2})
        await clock.advance(5)
        assert (await second.get(other.id)).status is Status.QUEUED  # the first job runs on
        for _ in range(20):
            if (await second.get(other.id)).status is not Status.QUEUED:
                break
            await clock.advance(5)
        assert (await second.get(other.id)).parked
    assert peak == 1 and len(jobs) == 2


# -- signatures --------------------------------------------------------------------------------
def signed(secret: str, body: bytes, at: int, msg_id: str = "msg_1") -> dict[str, str]:
    return {
        "Webhook-Id": msg_id,
        "Webhook-Timestamp": str(at),
        "Webhook-Signature": "v1,bm90LXRoaXM= " + sign(secret, msg_id, at, body),
    }


def test_verify_signature_accepts_the_simulators_signature() -> None:
    body = b'{"id":"job-1","status":"succeeded"}'
    now = int(time.time())
    verify("s3cret", signed("s3cret", body, now), body, now + 10)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("body", "no webhook-signature matches"),
        ("secret", "no webhook-signature matches"),
        ("old", "tolerance"),
        ("missing", "missing"),
    ],
)
def test_verify_signature_refuses(change: str, match: str) -> None:
    body = b'{"id":"job-1"}'
    now = int(time.time())
    headers = signed("s3cret", body, now)
    secret, at = "s3cret", float(now)
    if change == "body":
        body = b'{"id":"job-2"}'
    elif change == "secret":
        secret = "other"
    elif change == "old":
        at = now + 301.0
    else:
        del headers["Webhook-Signature"]
    with pytest.raises(WebhookSignatureError, match=match):
        verify(secret, headers, body, at)


def test_verify_signature_with_a_whsec_secret() -> None:
    import base64

    key = b"0123456789abcdef"
    secret = "whsec_" + base64.b64encode(key).decode()
    body = b"{}"
    now = int(time.time())
    # The simulator signs with the secret's bytes; a whsec_ secret means the decoded key.
    headers = signed(key.decode(), body, now)
    verify(secret, headers, body, now)


async def test_callback_for_an_unknown_job_or_a_running_one_changes_nothing(db_url: str) -> None:
    kinds = {"gen": {"adapter": "simulated", "url": "http://127.0.0.1:9"}}
    async with floodway_with(db_url, kinds) as fw:
        running = {"id": "job-x", "status": "running"}
        assert await apply_callback(fw.runtime, "gen", running) == Applied(False, None)
        finished = {"id": "job-x", "status": "succeeded", "result": {}}
        gone = await apply_callback(fw.runtime, "gen", finished, settle_wait_s=0)
        assert gone == Applied(False, None)
        with pytest.raises(ValueError, match="job id"):
            await apply_callback(fw.runtime, "gen", {"status": "succeeded"})
