"""The fleet: four real ``floodway worker`` processes and one ``floodway api``
process share one PostgreSQL ledger and one Redis limiter, against the simulated provider
capped at 10 in flight; the batches go in through the API.

Invariant 3 summed over processes (peak <= 10, no 429), invariants 1 and 2 under a SIGKILL
(nothing lost, nothing billed twice) and fail-closed dispatch while Redis is down. The last two
tests cover two narrower faults: a Redis restart without persistence while calls are in flight
(their slots are taken again before anything new is admitted), and a slot taken by a process
that dies before its claim (it expires with the claim TTL, not the slot TTL).

Each test gets its own PostgreSQL database and its own ``redis-server`` on a free port, so
stopping Redis here never touches the machine's shared one (nor the other tests using it).
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from floodway import Floodway, Status, Task
from floodway.core.states import TERMINAL
from floodway.limits.admission import AdmissionTuning, LimitsAdmission
from floodway.providers.sim import RunningSimulator, SimulatorConfig, running_simulator
from floodway.store.base import ReadyQuery, TaskQuery
from harness.fleet import (
    KIND,
    PG_URL,
    RESOURCE,
    ApiProcess,
    RedisServer,
    WorkerProcess,
    build,
    fresh_database,
    private_redis,
    spawn_api,
    spawn_worker,
)
from harness.processes import until

pytestmark = pytest.mark.slow

CAP = 10
TASKS = 200
WORKERS = 4
CLAIM_FAILED = "dispatch paused"


def _services_missing() -> str | None:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        return "redis-server is not installed"
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL at {PG_URL} is unavailable: {exc}"
    return None


@pytest.fixture(scope="module", autouse=True)
def _services() -> None:
    missing = _services_missing()
    if missing:
        pytest.skip(missing)


@dataclass
class Fleet:
    database: str
    redis: RedisServer
    sim: RunningSimulator
    fw: Floodway  # this process: it submits and watches (and runs a worker in the last test)
    tmp: Path
    workers: list[WorkerProcess]
    api: ApiProcess | None = None

    def spawn(self, n: int) -> None:
        """``n`` more worker processes, and the one ``floodway api`` process tasks go through."""
        if self.api is None:
            self.api = spawn_api(
                self.database, self.redis.url, self.sim.url, self.tmp / "api.log", cap=CAP
            )
        for _ in range(n):
            log = self.tmp / f"worker{len(self.workers) + 1}.log"
            self.workers.append(
                spawn_worker(self.database, self.redis.url, self.sim.url, log, cap=CAP)
            )

    async def all_ready(self) -> None:
        async def ready() -> bool:
            for w in self.workers:
                assert w.proc.poll() is None, f"worker {w.pid} exited:\n{w.output()}"
            return all(w.ready() for w in self.workers)

        await until(ready, 60, "every worker process started")
        assert self.api is not None
        await until(self.api.healthy, 60, "the API process answers")

    async def submit(self, n: int) -> list[Task]:
        """``n`` tasks in one ``POST /v1/batches`` to the API process."""
        assert self.api is not None, "spawn() first"
        ids = await self.api.submit_batch(KIND, [{"n": i} for i in range(n)])
        return await self.tasks(ids)

    async def tasks(self, ids: list[str]) -> list[Task]:
        return [await self.fw.get(i) for i in ids]

    async def wait_all_terminal(self, ids: list[str], timeout: float = 90) -> list[Task]:
        async def done() -> bool:
            stats = await self.fw.store.stats()
            return sum(stats.by_status[s.value] for s in TERMINAL) >= len(ids)

        await until(done, timeout, "every task terminal")
        return await self.tasks(ids)

    async def claim_owners(self, ids: list[str]) -> Counter[str]:
        """How many claims each worker made (the owner is the detail of a running event)."""
        owners: Counter[str] = Counter()
        for task_id in ids:
            for e in await self.fw.store.events(task_id):
                if e.status is Status.RUNNING:
                    owners[e.detail] += 1
        return owners

    def stop_workers(self) -> list[int]:
        """Stop the workers (their exit codes) and the API."""
        if self.api is not None:
            self.api.stop()
        return [w.stop() for w in self.workers]


@pytest.fixture
def latency_ms() -> float:
    """The provider's mean latency; a test overrides it with ``parametrize``."""
    return 50.0


@pytest.fixture
def sim_cap() -> int:
    """What the provider itself enforces (429 beyond it); 0 = nothing, to measure overshoot."""
    return CAP


@pytest.fixture
async def fleet(tmp_path: Path, latency_ms: float, sim_cap: int) -> AsyncIterator[Fleet]:
    config = SimulatorConfig(
        latency_ms=latency_ms, latency_jitter=0.2, max_concurrency=sim_cap, seed=7
    )
    async with (
        fresh_database() as database,
        private_redis(tmp_path / "redis") as redis,
        running_simulator(config) as sim,
    ):
        fw = build(database, sim.url, redis=redis.url, cap=CAP)
        fleet = Fleet(database, redis, sim, fw, tmp_path, [])
        try:
            async with fw:
                yield fleet
        finally:
            for w in fleet.workers:
                w.stop(10)
            if fleet.api is not None:
                fleet.api.stop(10)


async def slots_held(fw: Floodway) -> int:
    """Provider slots the shared limiter still counts as taken (0 once all is done: none
    leaked by a crash or an outage)."""
    admission = fw.runtime.admission
    assert isinstance(admission, LimitsAdmission)
    return (await admission.snapshot())[RESOURCE].in_flight


def assert_provider_saw_one_fleet(sim: RunningSimulator, tasks: list[Task]) -> None:
    """Invariants 1-3 as the provider and the ledger see them."""
    states = Counter(t.status for t in tasks)
    assert states == {Status.SUCCEEDED: len(tasks)}, states
    stats = sim.state.stats
    assert stats.peak_concurrency <= CAP, stats.as_dict()
    assert stats.rate_limited == 0, stats.as_dict()
    ledger = sim.state.ledger.as_dict()
    assert ledger["double_charged"] == []
    assert ledger["total"] == len(tasks)
    assert set(ledger["charges"]) == {t.work_key for t in tasks}


# -- 1. four processes, one limit ---------------------------------------------------------------
async def test_four_workers_never_exceed_the_shared_cap(fleet: Fleet) -> None:
    fleet.spawn(WORKERS)
    await fleet.all_ready()  # all four compete from the first task on
    ids = [t.id for t in await fleet.submit(TASKS)]
    final = await fleet.wait_all_terminal(ids)
    assert fleet.stop_workers() == [0] * WORKERS

    assert_provider_saw_one_fleet(fleet.sim, final)
    assert await slots_held(fleet.fw) == 0
    owners = await fleet.claim_owners(ids)
    assert sum(owners.values()) == TASKS  # no 429, no 5xx: one claim per task
    assert len(owners) >= 2, owners  # the work really was shared between processes


# -- 2. one of them SIGKILLed ---------------------------------------------------------------------
# 300 ms calls: the victim must still hold calls when the kill lands, a few ms after the look.
@pytest.mark.parametrize("latency_ms", [300.0])
async def test_sigkilled_worker_tasks_are_finished_by_the_others(fleet: Fleet) -> None:
    fleet.spawn(WORKERS)
    await fleet.all_ready()
    ids = [t.id for t in await fleet.submit(TASKS)]
    fw, sim = fleet.fw, fleet.sim

    async def running_of_one_worker() -> bool:
        if sim.state.ledger.total < 20:
            return False
        running = await fw.list_tasks(TaskQuery(status=Status.RUNNING, limit=100))
        return any(any(w.owns(t.lease_owner) for w in fleet.workers) for t in running)

    await until(running_of_one_worker, 60, "some tasks charged and some running")
    running = await fw.list_tasks(TaskQuery(status=Status.RUNNING, limit=100))
    victim = max(fleet.workers, key=lambda w: sum(w.owns(t.lease_owner) for t in running))
    victim.kill()
    # What the victim held when it died: running under its lease, and not finished by it.
    after = await fw.list_tasks(TaskQuery(status=Status.RUNNING, limit=100))
    orphans = [t.id for t in after if victim.owns(t.lease_owner)]
    assert orphans, "the victim held no task at its death: nothing was tested"
    assert sim.state.ledger.total < TASKS, "the batch finished before the kill"

    final = await fleet.wait_all_terminal(ids)
    survivors = [w for w in fleet.workers if w is not victim]
    assert [w.stop() for w in survivors] == [0] * (WORKERS - 1)

    assert_provider_saw_one_fleet(sim, final)
    assert await slots_held(fw) == 0  # the victim's slots were released by the recovery
    # Each orphan was finished by a survivor (its sweeper took the provider's result by
    # idempotency key, or a survivor claimed it again) and billed once.
    charges = sim.state.ledger.charges
    for task in final:
        if task.id in orphans:
            assert task.status is Status.SUCCEEDED
            assert charges[task.work_key] == 1


# -- 3. Redis stopped mid-run: dispatch pauses (fail closed), then resumes by itself ------------
# The outage tests come last; each stops only its own private redis-server.
@pytest.mark.parametrize("latency_ms", [100.0])
async def test_redis_outage_pauses_dispatch_and_the_run_completes(fleet: Fleet) -> None:
    fleet.spawn(WORKERS)
    await fleet.all_ready()
    ids = [t.id for t in await fleet.submit(TASKS)]
    sim, redis = fleet.sim, fleet.redis

    async def some_charged() -> bool:
        return sim.state.ledger.total >= 40

    await until(some_charged, 60, "40 tasks charged")
    failed_before = [w.count(CLAIM_FAILED) for w in fleet.workers]
    try:
        redis.stop()

        def failures(at_least: int) -> bool:
            return all(
                w.count(CLAIM_FAILED) - before >= at_least
                for w, before in zip(fleet.workers, failed_before, strict=True)
            )

        async def every_dispatcher_failed_once() -> bool:
            return failures(1)

        await until(every_dispatcher_failed_once, 30, "each dispatcher reports the outage")
        paused_from = time.time()

        async def provider_idle() -> bool:
            return sim.state.stats.in_flight == 0

        await until(provider_idle, 30, "requests sent before the outage have ended")
        requests_at_pause = sim.state.stats.requests

        async def outage_of_a_few_seconds() -> bool:  # each dispatcher backs off 1 s per try
            return failures(4)

        await until(outage_of_a_few_seconds, 30, "four failed claims per dispatcher")
        paused_until = time.time()
        # Fail closed: while Redis was down nobody sent a request, and nobody claimed a task.
        assert sim.state.stats.requests == requests_at_pause
        assert sim.state.ledger.total < TASKS, "the batch finished before the outage"
    finally:
        if not redis.running:
            await redis.start()  # empty, as after a crash without persistence

    final = await fleet.wait_all_terminal(ids)
    assert fleet.stop_workers() == [0] * WORKERS

    assert_provider_saw_one_fleet(sim, final)
    # Redis came back empty; nothing taken since was leaked by a dead pooled connection.
    assert await slots_held(fleet.fw) == 0
    for task_id in ids:
        for e in await fleet.fw.store.events(task_id):
            claimed_in_outage = e.status is Status.RUNNING and paused_from <= e.at <= paused_until
            assert not claimed_in_outage, (task_id, e)
    for w in fleet.workers:  # the dispatchers said why they paused
        text = w.output()
        assert "LimiterUnavailable" in text
        assert "the limiter's Redis is unavailable" in text


# -- 4. Redis loses its state while long calls are in flight -----------------------------------
@pytest.mark.parametrize(("latency_ms", "sim_cap"), [(4000.0, 0)])
async def test_redis_restart_during_long_calls_keeps_the_cap(fleet: Fleet) -> None:
    fleet.spawn(2)
    await fleet.all_ready()
    ids = [t.id for t in await fleet.submit(2 * CAP)]
    sim, redis = fleet.sim, fleet.redis

    async def cap_in_flight() -> bool:
        return sim.state.stats.in_flight == CAP

    await until(cap_in_flight, 30, "a full cap of calls in flight")
    try:
        redis.stop()

        async def a_dispatcher_failed() -> bool:
            return any(w.count(CLAIM_FAILED) >= 1 for w in fleet.workers)

        await until(a_dispatcher_failed, 30, "a dispatcher reports the outage")
    finally:
        await redis.start()
    if sim.state.stats.in_flight == 0:
        pytest.skip("the calls ended during the outage: nothing in flight to forget")
    final = await fleet.wait_all_terminal(ids)
    assert Counter(t.status for t in final) == {Status.SUCCEEDED: len(ids)}
    assert sim.state.stats.peak_concurrency <= CAP, sim.state.stats.as_dict()


# -- 5. a process dies between taking a slot and claiming the task ----------------------------
async def test_slot_orphaned_before_the_claim_does_not_block_its_task(fleet: Fleet) -> None:
    fw = fleet.fw
    [task] = await fw.submit_many(KIND, [{"n": 0}])
    # Another process (a 2 s claim TTL instead of 10 s, to keep the test short) admits it...
    doomed = build(
        fleet.database,
        fleet.sim.url,
        redis=fleet.redis.url,
        cap=CAP,
        tuning=AdmissionTuning(claim_ttl_s=2.0),
    )
    async with doomed:
        now = doomed.clock.now()
        ready = await doomed.store.ready(ReadyQuery((KIND,), now, 16))
        permits = await doomed.runtime.admission.admit(ready, now)
        assert [p.task_id for p in permits] == [task.id]
    # ... and dies here, before claiming the task. The orphaned slot expires with its claim TTL.
    async with fw.worker(concurrency=CAP, maintenance=True):

        async def done() -> bool:
            return (await fw.get(task.id)).terminal

        # within the claim TTL and a little, not the slot TTL (120 s)
        await until(done, 10, "the task runs although its slot was orphaned")
    assert (await fw.get(task.id)).status is Status.SUCCEEDED
