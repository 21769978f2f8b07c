"""The hang-up rule (floodway/core/hangup.py), against a provider that bills what it computed
whether or not floodway still listens (harness/billing.py), on SQLite and PostgreSQL.

Each test is one way floodway stops waiting for a call it sent: a timeout, a cancel while the
call runs, a deadline mid-call, a worker's death mid-call, an upstream job given up on while
it runs. Before the rule,
each paid again, let more calls run at the provider than the cap, or let a tenant spend past
its budget with the ledger saying less than the provider billed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from floodway import BudgetExceeded, Context, Floodway, Parked, Settings, Status, Task
from floodway.config import BudgetConfig, PriceConfig, ResourceConfig, TenantConfig, WorkerConfig
from floodway.kinds import UNBOUNDED_CALL_S
from floodway.store.base import ClaimParams, TaskQuery
from floodway.testing import FakeClock, settle, sever
from floodway.worker.worker import WorkerOptions
from harness.billing import BillingProvider
from harness.pg import fresh_schema, postgres_unavailable, schema_url

PRICE = 0.125  # per call (a binary fraction: sums of it are exact)
CALL_S = 3.0  # what the provider takes
TIMEOUT_S = 2.0  # what floodway waits
REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'hangup.db'}"
        return
    if (reason := postgres_unavailable()) is not None:
        pytest.skip(reason)
    async with fresh_schema() as schema:
        yield schema_url(schema)


@pytest.fixture(params=["local", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, str]]:
    """The limiter's settings: in process, or shared through the real Redis (under a key
    space of the test's own, deleted after it)."""
    if request.param == "local":
        yield {}
        return
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except RedisError:
        await client.aclose()
        pytest.skip("no Redis at 127.0.0.1:6379")
    prefix = f"hangup-{uuid.uuid4().hex}"
    try:
        yield {"redis": REDIS_URL, "redis_prefix": prefix}
    finally:
        keys = [key async for key in client.scan_iter(f"floodway:{{{prefix}}}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


def settings(database: str, *, cap: int = 4, budget: float | None = None) -> Settings:
    return Settings(
        database=database,
        resources={"api": ResourceConfig(concurrency=cap, price=PriceConfig(per_request=PRICE))},
        tenants=TenantConfig(
            interactive_depth=0,
            budget=None if budget is None else BudgetConfig(amount=budget, period="1d"),
        ),
    )


@asynccontextmanager
async def running(
    database: str,
    clock: FakeClock,
    provider: BillingProvider,
    *,
    cap: int = 4,
    budget: float | None = None,
    **kind: object,
) -> AsyncIterator[Floodway]:
    fw = Floodway(settings=settings(database, cap=cap, budget=budget), clock=clock)
    kind.setdefault("timeout", TIMEOUT_S)
    fw.kind("gen", resource="api", deadline=None, **kind)(provider.call)  # type: ignore[arg-type]
    try:
        async with fw.worker(concurrency=2 * cap, grace_s=0):
            yield fw
    finally:
        await fw.close()


async def step_until(
    clock: FakeClock, done: Callable[[], Awaitable[bool]], guard_s: float, step: float = 0.25
) -> None:
    """Step time until ``done()`` holds, for ``guard_s`` at most (the checks that follow say
    what went wrong then)."""
    for _ in range(int(guard_s / step)):
        if await done():
            return
        await clock.advance(step)
        await settle()


async def run_for(
    fw: Floodway, provider: BillingProvider, clock: FakeClock, seconds: float
) -> None:
    """Step time for ``seconds``, or less once nothing is left to happen: every task ended,
    its attempt closed, and the provider computing nothing."""

    async def ended() -> bool:
        tasks = await everything(fw)
        return provider.in_flight == 0 and all(t.terminal and t.lease_token is None for t in tasks)

    await step_until(clock, ended, seconds)


async def everything(fw: Floodway) -> list[Task]:
    return await fw.list_tasks(TaskQuery(limit=1000))


async def spent(fw: Floodway) -> float:
    """What the ledger recorded as spent (possibly billed included)."""
    return (await fw.budget_use("default", 0.0)).spent


async def test_a_timeout_never_pays_again_nor_passes_the_cap(
    database: str, clock: FakeClock
) -> None:
    """A provider slower than the timeout, without keys: each piece of work is billed once,
    the provider never runs more than the cap, every task ends ``timeout`` saying its billing
    is unknown, and the ledger records what the provider billed."""
    provider = BillingProvider(clock, call_s=CALL_S, price=PRICE, cap=4)
    async with running(database, clock, provider, max_attempts=3) as fw:
        for i in range(12):
            await fw.submit("gen", {"i": i})
        await settle()
        await run_for(fw, provider, clock, 60)
        tasks = await everything(fw)
        assert provider.violations == []
        assert provider.peak == 4
        assert max(provider.charges.values()) == 1 and len(provider.charges) == 12
        assert {t.status for t in tasks} == {Status.TIMEOUT}
        assert all(t.error is not None and "billing unknown" in t.error.message for t in tasks)
        assert all(t.lease_token is None for t in tasks)  # every attempt closed since
        assert await spent(fw) == pytest.approx(provider.billed)


async def test_a_timeout_to_a_provider_that_honours_keys_retries_under_the_same_key(
    database: str, clock: FakeClock
) -> None:
    """With keys the retry goes out at once and joins the call still running: one charge, a
    success, and the retry takes the slot its own first call holds (never above the cap)."""
    provider = BillingProvider(clock, call_s=CALL_S, price=PRICE, cap=4, honours_keys=True)
    async with running(database, clock, provider, max_attempts=3, idempotent=True) as fw:
        for i in range(8):
            await fw.submit("gen", {"i": i})
        await settle()
        await run_for(fw, provider, clock, 40)
        tasks = await everything(fw)
        assert provider.violations == []
        assert {t.status for t in tasks} == {Status.SUCCEEDED}
        assert sum(provider.charges.values()) == 8
        assert await spent(fw) == pytest.approx(provider.billed)


async def test_a_retry_takes_over_its_own_slot_when_its_first_call_fills_the_resource(
    database: str, clock: FakeClock
) -> None:
    """A cap of one, held by the task's own call it hung up on: the slot counts show the
    resource full, yet the retry is listed within an idle period (every kind is, once per
    idle period) and joins that call, rather than waiting out the hold."""
    provider = BillingProvider(clock, call_s=CALL_S, price=PRICE, cap=1, honours_keys=True)
    async with running(database, clock, provider, cap=1, max_attempts=3, idempotent=True) as fw:
        start = clock.now()
        task = await fw.submit("gen", {"i": 0})
        await settle()

        async def succeeded() -> bool:
            return (await fw.get(task.id)).status is Status.SUCCEEDED

        await step_until(clock, succeeded, 30)
        done = await fw.get(task.id)
        assert done.status is Status.SUCCEEDED and done.attempts == 2
        assert done.attempt_at is not None  # the retry, sent at the first look after its backoff
        idle = WorkerOptions.idle_poll_s  # every kind is listed once per idle period
        assert done.attempt_at - start <= TIMEOUT_S + idle + 0.5  # and two steps of the clock
        assert provider.violations == [] and sum(provider.charges.values()) == 1
        assert provider.violations == [] and sum(provider.charges.values()) == 1


async def test_retry_timeouts_resends_only_once_the_first_call_could_have_ended(
    database: str, clock: FakeClock
) -> None:
    """A kind that opts in pays again, knowingly; but the resend never runs beside the call it
    replaces, so the cap holds and no work has two calls at once."""
    provider = BillingProvider(clock, call_s=CALL_S, price=PRICE, cap=2)
    async with running(database, clock, provider, cap=2, max_attempts=2, retry_timeouts=True) as fw:
        for i in range(3):
            await fw.submit("gen", {"i": i})
        await settle()
        await run_for(fw, provider, clock, 60)
        tasks = await everything(fw)
        assert provider.violations == []
        assert {t.status for t in tasks} == {Status.DEAD}  # both attempts timed out
        assert set(provider.charges.values()) == {2}
        assert await spent(fw) >= provider.billed - 1e-9


async def test_a_cancel_reads_the_running_call_to_its_end_and_records_its_bill(
    database: str, clock: FakeClock
) -> None:
    """Cancelled while its call runs: the task ends ``cancelled`` at once, the call is read to
    its end, its bill recorded and its answer kept; the slot is taken until then, so no queued
    task reaches the provider beside it."""
    provider = BillingProvider(clock, call_s=CALL_S, price=PRICE, cap=2)
    async with running(database, clock, provider, cap=2, timeout=10.0) as fw:
        first = [await fw.submit("gen", {"i": i}) for i in range(2)]
        await settle()
        await run_for(fw, provider, clock, 1)
        queued = await fw.submit("gen", {"i": 9})
        for task in first:
            assert (await fw.cancel(task.id)).status is Status.CANCELLED
        await run_for(fw, provider, clock, 1)
        assert provider.in_flight == 2 and provider.violations == []
        assert (await fw.get(queued.id)).status is Status.QUEUED  # the slots are still taken
        await run_for(fw, provider, clock, 6)
        for task in first:
            done = await fw.get(task.id)
            assert done.status is Status.CANCELLED and done.lease_token is None
            assert done.result is not None  # the provider's answer, kept for the work
        assert (await fw.get(queued.id)).status is Status.SUCCEEDED
        assert sum(provider.charges.values()) == 3
        assert await spent(fw) == pytest.approx(provider.billed)


@pytest.mark.parametrize("how", ["cancel", "deadline"])
async def test_a_budget_cannot_be_walked_past_by_cancels_or_deadlines(
    database: str, clock: FakeClock, how: str
) -> None:
    """A budget of 10 calls, and room for more at the provider: submit to the budget, end
    each task once it runs (a cancel, or a deadline of 0.5 s), submit new work again, three
    rounds. The calls ended early still count until the provider has answered them: the
    provider never bills past the budget, and the ledger never records less than it billed."""
    provider = BillingProvider(clock, call_s=CALL_S, price=PRICE, cap=30)
    budget = 10 * PRICE
    deadline = 0.5 if how == "deadline" else None
    async with running(database, clock, provider, cap=30, budget=budget, timeout=10.0) as fw:
        for round in range(3):
            accepted = []
            for i in range(20):
                value = {"round": round, "i": i}
                try:
                    accepted.append(await fw.submit("gen", value, deadline_s=deadline))
                except BudgetExceeded:
                    break
            await settle()
            await run_for(fw, provider, clock, 1)
            if how == "cancel":
                for task in accepted:
                    if (await fw.get(task.id)).status is Status.RUNNING:
                        await fw.cancel(task.id)
            await run_for(fw, provider, clock, 0.5)
            assert provider.billed <= budget + 1e-9
            assert await spent(fw) >= provider.billed - 1e-9
        await run_for(fw, provider, clock, 10)
        ended_early = Status.CANCELLED if how == "cancel" else Status.TIMEOUT
        assert ended_early in {t.status for t in await everything(fw)}
        assert provider.violations == []
        assert provider.billed <= budget + 1e-9
        assert await spent(fw) == pytest.approx(provider.billed)
        use = await fw.budget_use("default", 0.0)
        assert use.held == 0


@pytest.mark.parametrize("lookup", [False, True])
async def test_a_call_slower_than_the_timeout_keeps_its_slot_past_its_workers_death(
    database: str, clock: FakeClock, lookup: bool
) -> None:
    """A process dies while its call, slower than the kind's timeout, runs on at the
    provider (no keys; with or without a look-up). The next process holds the dead call's
    slot as long as a call floodway hung up on at its timeout: one more timeout, not the
    timeout alone, so the next call (cap 1) does not run beside it."""
    provider = BillingProvider(clock, call_s=CALL_S, price=PRICE, cap=1)

    # A severed PostgreSQL process is not judged dead (closing its store said goodbye): its
    # lease expires instead, 5 s after its death.
    config = settings(database, cap=1).model_copy(update={"worker": WorkerConfig(lease=5.0)})

    def process() -> Floodway:
        fw = Floodway(settings=config, clock=clock)
        found = provider.look_up if lookup else None
        fw.kind("gen", resource="api", deadline=None, timeout=TIMEOUT_S, lookup=found)(
            provider.call
        )
        return fw

    first = process()
    async with AsyncExitStack() as alive:
        alive.push_async_callback(first.close)
        await alive.enter_async_context(first.worker(grace_s=0))
        dying = await first.submit("gen", {"i": 1})
        await run_for(first, provider, clock, 0.5)
        assert provider.in_flight == 1
        await sever(first)
    second = process()
    async with second, second.worker(grace_s=0):
        after = await second.submit("gen", {"i": 2})
        await run_for(second, provider, clock, CALL_S)  # past the timeout: the dead call still runs
        assert provider.violations == []
        await run_for(second, provider, clock, 2 * TIMEOUT_S + 4)
        done = await second.get(after.id)
        dead = await second.get(dying.id)
    assert done.status is Status.TIMEOUT  # it was sent, once the first call could have ended
    assert dead.lease_token is None  # its attempt closed then
    assert provider.violations == [] and provider.peak == 1
    assert sum(provider.charges.values()) == 2


JOB_S = 12.0  # an upstream job runs far longer than the call that submitted it (TIMEOUT_S)


def job_kind(fw: Floodway, provider: BillingProvider, hang_in: str | None = None) -> asyncio.Event:
    """A kind whose handler submits a job (the provider runs it ``JOB_S``, billing it when it
    ends) and parks; a poll reads it, and nothing can stop it upstream. ``hang_in``: the
    handler once it has recorded the job (``"submitting"``) or the poll (``"polling"``) hangs
    there; the event returned is set once it does."""
    hung = asyncio.Event()

    async def hang(where: str) -> None:
        if hang_in == where:
            hung.set()
            await asyncio.Event().wait()

    async def submit(ctx: Context, value: object) -> Parked:
        if ctx.upstream_ref is None:
            provider.start(ctx)
            await ctx.set_upstream_ref(ctx.work_key)
            await hang("submitting")
        return Parked(ctx.work_key, ctx.now() + 1.0)

    async def poll(ctx: Context, ref: str) -> tuple[str, object]:
        await hang("polling")
        if ref in provider.done:
            return "done", provider.done[ref]
        if any(call.key == ref for call in provider.running):
            return "running", None
        return "failed", "the job is gone"

    fw.kind(
        "job",
        resource="api",
        timeout=TIMEOUT_S,
        deadline=None,
        idempotent=True,
        poll=poll,
        poll_after=1.0,
        poll_max_attempts=1000,  # followed as long as it runs, the longest included
    )(submit)
    return hung


@pytest.mark.parametrize("how", ["cancel", "deadline"])
async def test_an_upstream_job_given_up_on_keeps_its_slot_until_a_poll_sees_it_end(
    database: str, clock: FakeClock, how: str
) -> None:
    """A job floodway stops following (its task cancelled, or past its deadline) while the
    provider goes on with it: the task ends at once, but the job's slot stays taken until a
    poll finds the job over, not for the submitting call's timeout, so the next job waits
    (cap 1) instead of running beside it; the attempt is closed then, the late result kept."""
    provider = BillingProvider(clock, call_s=JOB_S, price=PRICE, cap=1, honours_keys=True)
    fw = Floodway(settings=settings(database, cap=1), clock=clock)
    job_kind(fw, provider)
    try:
        async with fw.worker(grace_s=0):
            first = await fw.submit("job", {"i": 1}, deadline_s=3.0 if how == "deadline" else None)
            await run_for(fw, provider, clock, 1)
            assert (await fw.get(first.id)).parked
            if how == "cancel":
                await fw.cancel(first.id)
            second = await fw.submit("job", {"i": 2})
            # well past the timeout, the first job still runs
            await run_for(fw, provider, clock, JOB_S - 2)
            ended = await fw.get(first.id)
            assert ended.status is (Status.CANCELLED if how == "cancel" else Status.TIMEOUT)
            assert ended.lease_token is not None  # its attempt is open: the job runs
            assert (await fw.get(second.id)).status is Status.QUEUED
            assert provider.in_flight == 1 and provider.violations == []
            # The first job seen over on a poll's gap, then the second's whole run and its poll.
            await run_for(fw, provider, clock, 3 * JOB_S)
            closed, done = await fw.get(first.id), await fw.get(second.id)
        assert closed.lease_token is None and closed.result is not None  # the late success
        assert done.status is Status.SUCCEEDED
        assert provider.violations == [] and provider.peak == 1
        assert sum(provider.charges.values()) == 2
    finally:
        await fw.close()


async def test_a_job_whose_poller_died_keeps_its_slot_until_its_task_resumes_it(
    database: str, clock: FakeClock
) -> None:
    """A worker died holding the lease of a task whose job runs upstream (mid-handler, the
    job's id recorded, or mid-poll). The sweeper parks the task again and the job's slot
    stays taken until a poll finds it over, so a queued job (cap 1, interactive: admitted
    first) does not start beside it; the task ends with that job's result."""
    provider = BillingProvider(clock, call_s=JOB_S, price=PRICE, cap=1, honours_keys=True)
    config = settings(database, cap=1).model_copy(update={"worker": WorkerConfig(lease=2.0)})
    fw = Floodway(settings=config, clock=clock)
    job_kind(fw, provider)
    try:
        first = await fw.submit("job", {"i": 1})
        now = clock.now()
        params = ClaimParams("dead-worker", "dead-lease", ("job",), 1, now, lease_s=2.0)
        [claimed] = await fw.store.claim(params)
        await fw.runtime.context(claimed).set_upstream_ref(claimed.work_key)
        provider.start(fw.runtime.context(claimed))
        second = await fw.submit("job", {"i": 2}, lane="interactive")  # admitted first
        async with fw.worker(grace_s=0):
            await run_for(fw, provider, clock, JOB_S - 2)
            assert provider.violations == [] and provider.in_flight == 1
            assert (await fw.get(second.id)).status is Status.QUEUED
            await run_for(fw, provider, clock, JOB_S + 8)
            done = [await fw.get(first.id), await fw.get(second.id)]
        assert [t.status for t in done] == [Status.SUCCEEDED, Status.SUCCEEDED]
        assert done[0].upstream_ref == claimed.work_key  # resumed, not submitted again
        assert provider.violations == [] and sum(provider.charges.values()) == 2
    finally:
        await fw.close()


async def die_following_a_job(
    config: Settings, clock: FakeClock, provider: BillingProvider, moment: str
) -> Task:
    """A process that dies (SIGKILL) while it follows an upstream job: its handler has just
    recorded the job (``moment`` ``"submitting"``), or its poller is polling it
    (``"polling"``). Returns the task once the submitting call could have ended, when the
    process after it starts."""
    first = Floodway(settings=config, clock=clock)
    hung = job_kind(first, provider, hang_in=moment)
    async with AsyncExitStack() as alive:
        alive.push_async_callback(first.close)
        await alive.enter_async_context(first.worker(grace_s=0))
        dying = await first.submit("job", {"i": 1})

        async def hanging() -> bool:
            return hung.is_set()

        await step_until(clock, hanging, JOB_S / 2)
        assert hung.is_set() and provider.in_flight == 1
        await sever(first)
    await clock.advance(2 * TIMEOUT_S)
    return dying


def restarted(database: str, limiter: dict[str, str] | None = None) -> Settings:
    # A severed PostgreSQL process is not judged dead: its lease expires, 5 s after its death.
    update: dict[str, object] = {"worker": WorkerConfig(lease=5.0), **(limiter or {})}
    return settings(database, cap=1).model_copy(update=update)


@pytest.mark.parametrize("moment", ["submitting", "polling"])
async def test_a_process_started_after_a_death_holds_the_slot_of_the_job_it_followed(
    database: str, limiter: dict[str, str], clock: FakeClock, moment: str
) -> None:
    """A process dies while it follows an upstream job (:func:`die_following_a_job`). The
    process started after it holds that job's slot until a poll sees the job over: a queued
    job (cap 1, interactive: admitted first) waits instead of running beside it at the
    provider, and the first task ends with its job's result."""
    provider = BillingProvider(clock, call_s=JOB_S, price=PRICE, cap=1, honours_keys=True)
    config = restarted(database, limiter)
    dying = await die_following_a_job(config, clock, provider, moment)
    second = Floodway(settings=config, clock=clock)
    job_kind(second, provider)
    async with second, second.worker(grace_s=0):
        queued = await second.submit("job", {"i": 2}, lane="interactive")
        await run_for(second, provider, clock, 3 * JOB_S)
        done = [await second.get(dying.id), await second.get(queued.id)]
    assert provider.violations == [] and provider.peak == 1
    assert [t.status for t in done] == [Status.SUCCEEDED, Status.SUCCEEDED]
    assert done[0].upstream_ref == dying.work_key  # resumed, not submitted again
    assert sum(provider.charges.values()) == 2


async def test_a_job_longer_than_one_hold_keeps_its_slot_after_a_restart(
    database: str, clock: FakeClock
) -> None:
    """The dead process's job runs longer than one hold of its slot lasts (a hold is renewed,
    never endless): each poll that finds it running keeps the slot the restarted process
    holds for it, as it keeps a job's own, so the queued job waits to its very end. Time
    passes in jumps (each loop wakes once a jump, as after a pause) of less than a poll's
    longest gap. The in-process limiter: a Redis slot's time is the server's, not the
    test's clock."""
    long_s = UNBOUNDED_CALL_S + 10 * JOB_S

    def job_s(ctx: Context) -> float:
        return long_s if ctx.task.input == {"i": 1} else JOB_S

    provider = BillingProvider(clock, call_s=job_s, price=PRICE, cap=1, honours_keys=True)
    config = restarted(database)
    dying = await die_following_a_job(config, clock, provider, "polling")
    second = Floodway(settings=config, clock=clock)
    job_kind(second, provider)
    async with second, second.worker(grace_s=0):
        queued = await second.submit("job", {"i": 2}, lane="interactive")
        await run_for(second, provider, clock, JOB_S)  # resumed, polled on the job's gaps
        for _ in range(int(2 * long_s / 30)):
            if (await second.get(dying.id)).terminal:
                break
            await clock.jump(30)
        assert (await second.get(dying.id)).status is Status.SUCCEEDED
        await run_for(second, provider, clock, 3 * JOB_S)
        done = await second.get(queued.id)
    assert provider.violations == [] and provider.peak == 1
    assert done.status is Status.SUCCEEDED and sum(provider.charges.values()) == 2


async def test_a_severed_process_is_found_dead_at_once_by_a_peer(database: str) -> None:
    """``sever`` stands for SIGKILL in these tests: a peer started right after it finds the
    process dead (its liveness lock free, its registration left), so it reconciles the
    process's calls at once instead of waiting for their leases to expire."""
    severed = Floodway(settings=settings(database))
    peer = Floodway(settings=settings(database))
    try:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(severed.worker(concurrency=1, grace_s=0))
            identity = severed.store.identity
            await peer.open()
            assert await peer.store.dead([identity]) == set()
            await sever(severed)
            assert await peer.store.dead([identity]) == {identity}
    finally:
        await peer.close()
        await severed.close()
