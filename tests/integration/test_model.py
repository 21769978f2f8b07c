"""A model of floodway that looks for the next money, isolation or recovery defect.

A hypothesis state machine drives the real engine (``Floodway`` on a real ledger, SQLite and
PostgreSQL, with its workers, sweeper and limits) on a fake clock, against a fake billed
provider that counts what it charges per piece of work. The steps: submits (the same and other
inputs, two tenants, both lanes, request keys, deadlines, inputs that fail first), time passing,
a process killed at any step and restarted (the calls it left running go on at the provider, or
end with it), cancels, manual retries, ``dlq retry --all``, and upstream jobs whose callbacks
race their polls, calls slower than the kinds' timeout, cancels of one task or of all a
tenant's at once (a batch's cancel), over the shared billed provider that bills what it
computed whether or not floodway still listens (harness/billing.py). After every step: no
work billed twice (but where floodway cannot know, see
:meth:`ChargingProvider.may_bill_again`), never two calls of one work at once, never more calls
in flight than the cap, no result or ``duplicate_of`` that crosses a tenant, no task with
another work's result, the ledger's spend and holds covering the provider's bill, no budget
passed by spend and holds. At the end the model drains: every accepted task is in the ledger,
ended, its attempt closed, and the ledger records at least what the provider billed.

``FLOODWAY_MODEL_EXAMPLES`` sets the number of examples per backend and draws new ones each
run (default: a few, the same every run, for CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from floodway import (
    AdmissionRefused,
    AttemptStillOpen,
    BudgetExceeded,
    Context,
    Floodway,
    IllegalTransition,
    Parked,
    Settings,
    Status,
    Task,
)
from floodway.config import BudgetConfig, PriceConfig, ResourceConfig, TenantConfig
from floodway.store.base import SpendQuery, TaskQuery
from floodway.testing import FakeClock, settle, sever
from floodway.worker.callbacks import apply_callback
from harness.billing import BillingProvider, Call
from harness.pg import fresh_schema, postgres_unavailable, schema_url

#: a hunt (the variable set) draws new examples every run; CI's default few are the same
#: every run, so a red build is a regression, not a lucky draw
HUNTING = "FLOODWAY_MODEL_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("FLOODWAY_MODEL_EXAMPLES", "8"))
CAP = 2  # the provider's in-flight cap, configured on the resource
CALL_S = 3.0  # how long the provider takes over one call (fake seconds)
TIMEOUT_S = 10.0  # the kinds' call timeout: a dead worker's call may run this long
SLOW_CALL_S = 12.0  # a slow input's calls: floodway hangs up on them at the timeout
PRICE = 0.125  # what a call bills (a binary fraction: sums of it are exact)
BUDGET = 2.0  # each tenant's, per period: 16 calls
PERIOD_S = 1000 * 86400.0  # longer than any example runs
TENANTS = ("t1", "t2")


@dataclass(frozen=True)
class Behaviour:
    """What one kind's provider does, and what the kind declares about it."""

    honours_keys: bool  # a second call with the same Idempotency-Key joins or replays
    lookup: bool  # finished work can be found by its key
    share: str = "tenant"
    upstream: bool = False  # submit a job, then poll it (or hear its callback)


KINDS: dict[str, Behaviour] = {
    "safe": Behaviour(honours_keys=True, lookup=False),
    "plain": Behaviour(honours_keys=False, lookup=False),
    "lookup": Behaviour(honours_keys=False, lookup=True),
    "shared": Behaviour(honours_keys=False, lookup=True, share="global"),
    "job": Behaviour(honours_keys=True, lookup=False, upstream=True),
}


def work_of(kind: str, tenant: str, value: Any) -> str:
    """The model's name for a piece of work: what the provider bills once."""
    scope = "*" if KINDS[kind].share == "global" else tenant
    return f"{kind}/{scope}/{json.dumps(value, sort_keys=True)}"


def kind_of(ctx: Context) -> str:
    return ctx.task.kind


def model_work(ctx: Context) -> str:
    return work_of(ctx.task.kind, ctx.task.tenant, ctx.task.input)


def call_s(ctx: Context) -> float:
    """A ``slow`` input's calls outlast the kinds' timeout: floodway hangs up on them."""
    return SLOW_CALL_S if ctx.task.input.get("slow") else CALL_S


def first_calls_fail(ctx: Context, call: int) -> bool:
    """An input's ``fails`` first calls answer 503 (not billed)."""
    return call <= int(ctx.task.input.get("fails", 0))


@dataclass
class ChargingProvider(BillingProvider):
    """The shared billed provider (harness/billing.py) on the fake clock: a call takes
    ``CALL_S`` (``SLOW_CALL_S`` for a slow input) and is charged when it finishes, whether
    or not floodway still listens; kinds honour keys as :data:`KINDS` says. It also keeps
    what floodway could not see: works a call of which went on after floodway hung up (a
    timeout, a kill) at a provider that can neither replay nor look it up."""

    #: works a call of which ran on unseen, at a provider without keys nor look-up
    unknowable: set[str] = field(default_factory=set)
    #: works a manual retry asked to run again after such a call
    retried_by_hand: Counter[str] = field(default_factory=Counter)

    def hung_up(self, ctx: Context, call: Call) -> None:
        behaviour = KINDS[ctx.task.kind]
        if not behaviour.honours_keys and not behaviour.lookup:
            self.unknowable.add(call.work)

    def may_bill_again(self, work: str) -> int:
        """How many charges beyond the first a work may have: one for each manual retry that
        followed a call nobody could see end, on a provider that can neither replay it nor look
        it up (the one path the guarantees table says may pay twice, on request); and one for
        new submits of such work, which floodway has no way to tell from new work."""
        if work not in self.unknowable:
            return 0
        return 1 + self.retried_by_hand[work]


def charging_provider(clock: FakeClock) -> ChargingProvider:
    return ChargingProvider(
        clock,
        call_s=call_s,
        price=PRICE,
        honours_keys=lambda ctx: KINDS[ctx.task.kind].honours_keys,
        cap=CAP,
        work_of=model_work,
        fails=first_calls_fail,
    )


def kind_handlers(provider: ChargingProvider, fw: Floodway) -> None:
    """Declare the model's kinds on ``fw``, each calling ``provider``."""
    for name, behaviour in KINDS.items():
        if behaviour.upstream:
            declare_job_kind(provider, fw, name)
            continue

        async def handler(ctx: Context, value: Any) -> Any:
            return await provider.call(ctx)

        fw.kind(
            name,
            resource="api",
            max_attempts=2,
            deadline=None,
            timeout=TIMEOUT_S,
            share="global" if behaviour.share == "global" else "tenant",
            idempotent=behaviour.honours_keys,
            lookup=provider.look_up if behaviour.lookup else None,
        )(handler)


def declare_job_kind(provider: ChargingProvider, fw: Floodway, name: str) -> None:
    """A kind that submits an upstream job, parks, and is finished by a poll or a callback.
    The job's id is its work key: the provider joins a resubmission to the same job."""

    async def handler(ctx: Context, value: Any) -> Any:
        if ctx.upstream_ref is None or ctx.upstream_ref not in provider.done:
            if not any(j.key == ctx.work_key for j in provider.running):
                job = provider.start(ctx)
                job.answer.add_done_callback(_consume)
            await ctx.set_upstream_ref(ctx.work_key)
        return Parked(ctx.work_key, ctx.now() + CALL_S / 2)

    async def poll(ctx: Context, ref: str) -> tuple[str, Any]:
        if ref in provider.done:
            return "done", provider.done[ref]
        if any(j.key == ref for j in provider.running):
            return "running", None
        return "failed", "503 Service Unavailable"  # the job failed: submit it again

    fw.kind(
        name,
        resource="api",
        max_attempts=3,
        deadline=None,
        timeout=TIMEOUT_S,
        idempotent=True,
        poll=poll,
        poll_after=CALL_S / 2,
    )(handler)


def _consume(answer: asyncio.Future[dict[str, Any]]) -> None:
    """An upstream job's answer is read by a poll, not awaited: mark its failure as seen."""
    if not answer.cancelled():
        answer.exception()


class Process:
    """One floodway process: an open ``Floodway`` running workers and maintenance."""

    def __init__(self, fw: Floodway, stack: AsyncExitStack) -> None:
        self.fw = fw
        self.stack = stack

    @classmethod
    async def start(cls, database: str, clock: FakeClock, provider: ChargingProvider) -> Process:
        settings = Settings(
            database=database,
            resources={
                "api": ResourceConfig(concurrency=CAP, price=PriceConfig(per_request=PRICE))
            },
            tenants=TenantConfig(
                interactive_depth=0, budget=BudgetConfig(amount=BUDGET, period=PERIOD_S)
            ),
        )
        fw = Floodway(settings=settings, clock=clock)
        kind_handlers(provider, fw)
        stack = AsyncExitStack()
        stack.push_async_callback(fw.close)
        await stack.enter_async_context(fw.worker(concurrency=4, grace_s=0))
        return cls(fw, stack)

    async def kill(self) -> None:
        """As SIGKILL would: from this instant nothing of this process reaches the ledger
        (a closed store refuses every later read and write), its liveness lock is free as the
        kernel or the server would free it, and then its coroutines are torn down."""
        await sever(self.fw)
        await self.stack.aclose()

    async def stop(self) -> None:
        await self.stack.aclose()


@dataclass(frozen=True)
class Submit:
    """One submit the model makes: the same and other inputs, tenants, lanes, request keys,
    deadlines, and inputs whose first calls fail."""

    kind: str
    tenant: str
    n: int
    fails: int
    lane: str
    keyed: bool
    deadline: float | None
    slow: bool


SUBMITS = st.builds(
    Submit,
    kind=st.sampled_from(sorted(KINDS)),
    tenant=st.sampled_from(TENANTS),
    n=st.integers(0, 2),
    fails=st.integers(0, 2),
    lane=st.sampled_from(["background", "interactive"]),
    keyed=st.booleans(),
    deadline=st.sampled_from([None, None, 2.0, 5.0]),
    slow=st.sampled_from([False, False, False, True]),
)


@dataclass
class Submitted:
    id: str
    kind: str
    tenant: str
    work: str


class LedgerModel(RuleBasedStateMachine):
    """The state machine; a subclass per backend says which ledger it runs on."""

    backend: ClassVar[str] = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.resources = AsyncExitStack()
        self.clock = FakeClock()
        self.provider = charging_provider(self.clock)
        self.tasks: dict[str, Submitted] = {}
        self.keys: dict[tuple[str, str], str] = {}  # (tenant, request key) -> task id
        self.database = self.run(self._database())
        self.process: Process | None = self.run(self._start())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _database(self) -> str:
        if self.backend == "sqlite":
            folder = self.resources.enter_context(tempfile.TemporaryDirectory())
            return f"sqlite:///{Path(folder) / 'model.db'}"
        schema = await self.resources.enter_async_context(fresh_schema())
        return schema_url(schema)

    async def _start(self) -> Process:
        process = await Process.start(self.database, self.clock, self.provider)
        await settle()
        return process

    @property
    def fw(self) -> Floodway:
        assert self.process is not None
        return self.process.fw

    # -- steps --------------------------------------------------------------------------------
    @initialize(first=st.lists(SUBMITS, min_size=2, max_size=6))
    def submit_a_few(self, first: list[Submit]) -> None:
        """Every example starts with work to do."""
        for one in first:
            self._submit(one)

    @rule(one=SUBMITS)
    def submit(self, one: Submit) -> None:
        self._submit(one)

    def _submit(self, one: Submit) -> None:
        value: dict[str, Any] = {"n": one.n, "fails": one.fails}
        if one.slow:
            value["slow"] = True
        key = (
            f"{one.kind}-{one.n}-{one.fails}-{one.slow}-{one.deadline}-{one.lane}"
            if one.keyed
            else None
        )
        try:
            task = self.run(
                self.fw.submit(
                    one.kind,
                    value,
                    lane=one.lane,
                    key=key,
                    tenant=one.tenant,
                    deadline_s=one.deadline,
                )
            )
        except (AdmissionRefused, BudgetExceeded):
            return  # not accepted: nothing to keep
        if key is not None:  # the same request key, the same task
            assert self.keys.setdefault((one.tenant, key), task.id) == task.id
        work = work_of(one.kind, one.tenant, value)
        self.tasks[task.id] = Submitted(task.id, one.kind, one.tenant, work)
        self.run(settle())

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 4.0, 12.0]))
    def time_passes(self, seconds: float) -> None:
        self.run(self.clock.advance(seconds))

    @rule(calls_survive=st.booleans(), downtime=st.sampled_from([0.0, 1.0, 5.0]))
    def kill_and_restart(self, calls_survive: bool, downtime: float) -> None:
        process, self.process = self.process, None
        assert process is not None
        if calls_survive:
            for job in self.provider.running:
                kind = job.work.split("/", 1)[0]
                if not KINDS[kind].honours_keys and not KINDS[kind].lookup:
                    self.provider.unknowable.add(job.work)
        else:  # the provider went down with the process's connections: nothing billed
            self.provider.stop_all()
        self.run(process.kill())
        self.run(self.clock.advance(downtime))
        self.process = self.run(self._start())

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = data.draw(self._a_task())
        with contextlib.suppress(IllegalTransition):  # it had ended
            self.run(self.fw.cancel(task_id))
        self.run(settle())

    @rule(tenant=st.sampled_from(TENANTS))
    def cancel_a_batch(self, tenant: str) -> None:
        """Every unfinished task of a tenant cancelled in one go, waiting ones first, as the
        cancel of a batch does: none of them may be sent after its cancel landed."""
        tasks = self.run(self.fw.list_tasks(TaskQuery(tenant=tenant, limit=1000)))
        ordered = sorted(
            (t for t in tasks if not t.terminal), key=lambda t: t.status is Status.RUNNING
        )
        for task in ordered:
            with contextlib.suppress(IllegalTransition):
                self.run(self.fw.cancel(task.id))
        self.run(settle())

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        self._retry(data.draw(self._a_task()))

    def _a_task(self) -> st.SearchStrategy[str]:
        """One of the accepted tasks, in the order they were submitted: their ids are partly
        random, and a draw by id order would name another task when an example is replayed
        (its shrinking would then fail as flaky)."""
        return st.sampled_from(list(self.tasks))

    @rule()
    def dlq_retry_all(self) -> None:
        """What ``floodway dlq retry --all`` does: every dead letter, retried."""
        dead = self.run(self.fw.list_tasks(TaskQuery(status=Status.DEAD, limit=1000)))
        for task in dead:
            self._retry(task.id)

    def _retry(self, task_id: str) -> None:
        try:
            self.run(self.fw.retry(task_id))
        except (IllegalTransition, AttemptStillOpen):
            return  # not retryable now: nothing changed
        work = self.tasks[task_id].work
        if work in self.provider.unknowable:
            self.provider.retried_by_hand[work] += 1
        self.run(settle())

    @rule(done=st.booleans())
    def provider_calls_back(self, done: bool) -> None:
        """The provider's callback about an upstream job, racing the poller: a job that
        finished (or a stale "running" note); a job unknown to the ledger changes nothing."""
        for key, result in list(self.provider.done.items()):
            if not result["work"].startswith("job/"):
                continue
            payload = (
                {"id": key, "status": "succeeded", "result": result}
                if done
                else {"id": key, "status": "running"}
            )
            self.run(apply_callback(self.fw.runtime, "job", payload, settle_wait_s=0))
        self.run(settle())

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def provider_saw_no_violation(self) -> None:
        assert self.provider.violations == [], self.provider.violations

    @invariant()
    def no_work_billed_twice(self) -> None:
        for work, charged in self.provider.charges.items():
            allowed = 1 + self.provider.may_bill_again(work)
            assert charged <= allowed, f"{work} billed {charged} times"

    @invariant()
    def the_ledger_never_says_less_than_the_bill(self) -> None:
        """What the ledger spent and still holds covers what the provider billed, at every
        step (an attempt nobody saw end holds its estimate until it is recorded)."""
        if self.process is None:
            return
        spent, held = self.run(self._spend())
        assert spent + held >= self._billed() - 1e-9, (spent, held, self._billed())

    @invariant()
    def no_budget_is_passed(self) -> None:
        if self.process is None:
            return
        for tenant in TENANTS:
            use = self.run(self.fw.budget_use(tenant, 0.0))
            assert use.spent + use.held <= BUDGET + 1e-9, (tenant, use)

    def _billed(self) -> float:
        """What the provider billed for calls whose spend the ledger records (an upstream
        job's is not a call floodway reads the bill of)."""
        charges = self.provider.charges
        return PRICE * sum(n for work, n in charges.items() if not work.startswith("job/"))

    async def _spend(self) -> tuple[float, float]:
        """What the ledger spent on calls it reads the bill of, and what every task holds."""
        report = await self.fw.spend(SpendQuery(since=0.0))
        spent = sum(line.cost for line in report.lines if line.kind != "job")
        held = sum([(await self.fw.budget_use(t, 0.0)).held for t in TENANTS])
        return spent, held

    @invariant()
    def nothing_lost_nor_crossing_a_tenant(self) -> None:
        if self.process is None:
            return
        tasks = self._ledger()
        lost = sorted(set(self.tasks) - set(tasks))
        assert lost == [], f"accepted, not in the ledger: {lost}"
        for task in tasks.values():
            self._check_task(task, tasks)

    def _ledger(self) -> dict[str, Task]:
        everyone = self.run(self.fw.list_tasks(TaskQuery(limit=1000)))
        return {t.id: t for t in everyone}

    def _check_task(self, task: Task, tasks: dict[str, Task]) -> None:
        mine = self.tasks.get(task.id)
        if mine is None:
            return
        if task.duplicate_of is not None:
            source = tasks[task.duplicate_of]
            assert source.tenant == task.tenant, f"{task.id} names another tenant's task"
        if task.result is not None:
            assert task.result["work"] == mine.work, f"{task.id} holds another work's result"
            if KINDS[mine.kind].share == "tenant":
                assert task.result["tenant"] == task.tenant, f"{task.id}: another's result"

    # -- the end ------------------------------------------------------------------------------
    def teardown(self) -> None:
        try:
            if self.process is not None:
                self.run(self._drain_and_check())
        finally:
            if self.process is not None:
                self.run(self.process.stop())
            self.run(self.resources.aclose())
            self.loop.close()

    async def _drain_and_check(self) -> None:
        """Let time pass until every task and its attempt have ended and the provider is idle:
        nothing lost, nothing held, and the ledger records at least what the provider billed."""
        for _ in range(400):
            tasks = await self.fw.list_tasks(TaskQuery(limit=1000))
            ended = all(t.terminal and t.lease_token is None for t in tasks)  # attempts too
            if ended and not self.provider.running:
                break
            await self.clock.advance(5.0)
        tasks = await self.fw.list_tasks(TaskQuery(limit=1000))
        found = {t.id: t for t in tasks}
        lost = sorted(set(self.tasks) - set(found))
        assert lost == [], f"accepted, not in the ledger: {lost}"
        stuck = [(t.id, t.kind, t.status.value) for t in tasks if not t.terminal]
        assert stuck == [], f"never ended: {stuck}"
        for status in sorted({t.status.value for t in tasks}):
            event(f"some task ended {status}")  # what the examples reached
        event(f"calls charged: {min(sum(self.provider.charges.values()), 10)}+")
        event(f"tasks: {min(len(self.tasks), 10)}+")
        for task in tasks:
            self._check_task(task, found)
            if task.status in (Status.SUCCEEDED, Status.DEDUPED):
                assert task.result is not None, f"{task.status.value} without a result: {task}"
        self.provider_saw_no_violation()
        self.no_work_billed_twice()
        spent, held = await self._spend()
        assert held == 0 and spent >= self._billed() - 1e-9, (spent, self._billed())


class SqliteModel(LedgerModel):
    backend = "sqlite"


class PostgresModel(LedgerModel):
    backend = "postgres"


MODEL_SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=not HUNTING,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

#: the whole run is one test: a guard against hangs that grows with the examples asked for
RUN_TIMEOUT = pytest.mark.timeout(60 + 30 * EXAMPLES)


@RUN_TIMEOUT
class TestSqliteModel(SqliteModel.TestCase):  # type: ignore[name-defined,misc]
    settings = MODEL_SETTINGS


@RUN_TIMEOUT
@pytest.mark.skipif(postgres_unavailable() is not None, reason=str(postgres_unavailable()))
class TestPostgresModel(PostgresModel.TestCase):  # type: ignore[name-defined,misc]
    settings = MODEL_SETTINGS
