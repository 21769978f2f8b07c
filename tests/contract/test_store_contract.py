"""The store contract: one suite, run on every backend (see ``conftest.py``).

Each test pins one rule of the Store protocol so that breaking the rule fails it. Time is
explicit (every verb takes ``now``); nothing sleeps except the change-feed tests, which
wait on a real notification with a bounded timeout.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from floodway.core.errors import (
    AdmissionRefused,
    IdempotencyConflict,
    IllegalTransition,
    StoreError,
    TaskNotFound,
)
from floodway.core.outcome import Completion
from floodway.core.states import Status
from floodway.core.task import ErrorClass, ErrorInfo, Lane, NewTask, Task
from floodway.core.tiers import LineResult
from floodway.store.base import (
    ClaimParams,
    ReadyQuery,
    Retention,
    Store,
    TaskChange,
    TaskQuery,
    WorkerInfo,
)
from floodway.store.postgres import PostgresStore
from floodway.store.queries import load_migrations, load_queries
from floodway.store.sqlite import SqliteStore
from floodway.store.tier_records import TierRecords

from .conftest import PG_URL, Backend

NOW = 1_700_000_000.0
KINDS = ("echo", "other")
S = Status


def task(kind: str = "echo", n: int = 1, **kw: Any) -> NewTask:
    kw.setdefault("input", {"n": n})
    return NewTask(kind=kind, **kw)


async def submit(store: Store, now: float = NOW, **kw: Any) -> Task:
    return (await store.submit([task(**kw)], now))[0].task


async def claim(
    store: Store,
    now: float = NOW,
    limit: int = 10,
    *,
    kinds: tuple[str, ...] = KINDS,
    token: str = "tok-1",
    owner: str = "w1",
    ids: tuple[str, ...] | None = None,
    lease_s: float = 30.0,
) -> list[Task]:
    return await store.claim(ClaimParams(owner, token, kinds, limit, now, lease_s, ids))


async def run_one(store: Store, now: float = NOW, **kw: Any) -> Task:
    """Submit a task and claim it (token ``tok-1``)."""
    t = await submit(store, now, **kw)
    (got,) = await claim(store, now, ids=(t.id,))
    return got


async def finish(store: Store, t: Task, to: Status, now: float = NOW + 1, **kw: Any) -> Task:
    (applied,) = await store.complete([Completion(t.id, to, lease_token=t.lease_token, **kw)], now)
    assert applied.applied, applied
    got = await store.get(t.id)
    assert got is not None
    return got


async def load(store: Store, task_id: str) -> Task:
    got = await store.get(task_id)
    assert got is not None
    return got


async def count(store: Store) -> int:
    return sum((await store.stats()).by_status.values())


def fail(msg: str = "boom") -> ErrorInfo:
    return ErrorInfo(ErrorClass.FATAL, "fatal", msg)


# -- submit and the request key -----------------------------------------------------------


async def test_a_server_tells_its_time_and_a_file_on_this_host_does_not(
    store: Store, backend: Backend
) -> None:
    before = time.time()
    told = await store.server_time()
    if backend.name == "sqlite":
        assert told is None
    else:  # the test server runs on this host: its clock is ours
        assert told is not None and before - 1 <= told <= time.time() + 1


async def test_submit_writes_queued_tasks_with_unique_ids_and_an_event(store: Store) -> None:
    subs = await store.submit([task(n=i) for i in range(3)], NOW)
    ids = [s.task.id for s in subs]
    assert len(set(ids)) == 3
    for s in subs:
        assert not s.reused
        assert s.task.status is S.QUEUED
        assert (s.task.attempts, s.task.created_at, s.task.next_attempt_at) == (0, NOW, NOW)
        assert await store.get(s.task.id) == s.task
        (ev,) = await store.events(s.task.id)
        assert (ev.status, ev.at, ev.attempt) == (S.QUEUED, NOW, 0)
    assert await store.get(ids[0], tenant="someone-else") is None
    assert await store.get("t_missing") is None


async def test_submit_round_trips_every_field(store: Store) -> None:
    t = await submit(
        store,
        tenant="acme",
        lane=Lane.INTERACTIVE,
        max_attempts=7,
        deadline_s=60,
        cost_estimated=12.5,
        metadata={"b": 1, "a": [1, "x"]},
        callback_url="http://cb",
        batch_id="b1",
        input={"z": 1, "a": "\u00e9\u0000"},
    )
    got = await load(store, t.id)
    assert got == t
    assert list(got.input) == ["z", "a"] and got.input["a"] == "\u00e9\u0000"
    assert (got.tenant, got.lane, got.max_attempts, got.deadline_at) == (
        "acme",
        Lane.INTERACTIVE,
        7,
        NOW + 60,
    )
    assert (got.metadata, got.callback_url, got.batch_id, got.cost_estimated) == (
        {"b": 1, "a": [1, "x"]},
        "http://cb",
        "b1",
        12.5,
    )


async def test_request_key_returns_the_same_task(store: Store) -> None:
    first = (await store.submit([task(request_key="k1", request_hash="h")], NOW))[0]
    again = (await store.submit([task(request_key="k1", request_hash="h")], NOW + 5))[0]
    assert again.reused and not first.reused
    assert again.task.id == first.task.id
    assert await count(store) == 1
    other_tenant = (
        await store.submit([task(request_key="k1", request_hash="h", tenant="b")], NOW)
    )[0]
    assert other_tenant.task.id != first.task.id


async def test_request_key_with_another_body_conflicts_and_writes_nothing(store: Store) -> None:
    first = await submit(store, request_key="k1", request_hash="h1")
    with pytest.raises(IdempotencyConflict) as info:
        await store.submit([task(request_key="k1", request_hash="h2")], NOW + 1)
    assert info.value.task_id == first.id
    assert await count(store) == 1


async def test_expired_request_key_gives_a_new_task(store: Store) -> None:
    first = await submit(store, request_key="k", request_hash="h", key_ttl_s=10)
    second = (await store.submit([task(request_key="k", request_hash="h2")], NOW + 11))[0]
    assert not second.reused and second.task.id != first.id
    third = (await store.submit([task(request_key="k", request_hash="h2")], NOW + 12))[0]
    assert third.reused and third.task.id == second.task.id


async def test_concurrent_submits_with_one_key_make_one_task(backend: Backend) -> None:
    async with backend.opened() as a, backend.opened() as b:
        subs = await asyncio.gather(
            *[s.submit([task(request_key="same", request_hash="h")], NOW) for s in [a, b] * 6]
        )
        assert len({s[0].task.id for s in subs}) == 1
        assert sum(not s[0].reused for s in subs) == 1
        assert await count(a) == 1


async def test_a_burst_of_keyed_submits_gives_each_key_one_task(backend: Backend) -> None:
    """Keyed submits issued together share one statement; replays, an expired key and the same
    keys sent at once from another process still come out as one at a time would."""
    async with backend.opened() as a, backend.opened() as b:
        old = await submit(a, request_key="old", request_hash="h", key_ttl_s=10)
        replayed = await submit(a, request_key="replay", request_hash="h")
        batch = [task(n=i, request_key=f"k{i}", request_hash=f"h{i}") for i in range(5)]
        first, second, (again,), (renewed,), (plain,) = await asyncio.gather(
            a.submit(batch, NOW + 20),
            b.submit(batch, NOW + 20),
            a.submit([task(request_key="replay", request_hash="h")], NOW + 20),
            a.submit([task(request_key="old", request_hash="h2")], NOW + 20),
            a.submit([task(n=9)], NOW + 20),
        )
        assert [s.task.id for s in first] == [s.task.id for s in second]
        assert sorted(s.reused for s in first + second) == [False] * 5 + [True] * 5
        assert again.reused and again.task.id == replayed.id
        assert not renewed.reused and renewed.task.id != old.id
        assert not plain.reused
        assert await count(a) == 2 + 5 + 1 + 1
        with pytest.raises(IdempotencyConflict):
            await a.submit([task(request_key="k0", request_hash="other")], NOW + 21)
        assert await count(a) == 9


# -- the work fingerprint -------------------------------------------------------------------


async def test_fingerprint_of_a_succeeded_task_dedupes_with_its_result(store: Store) -> None:
    primary = await run_one(store, fingerprint="fp")
    await finish(store, primary, S.SUCCEEDED, result={"answer": 42})
    dup = await submit(store, NOW + 2, fingerprint="fp")
    assert dup.status is S.DEDUPED
    assert (dup.duplicate_of, dup.waits_for) == (primary.id, None)
    assert dup.result == {"answer": 42} and dup.finished_at == NOW + 2
    assert [e.status for e in await store.events(dup.id)] == [S.QUEUED, S.DEDUPED]
    assert await claim(store, NOW + 3) == []


async def test_a_request_for_a_new_sample_runs_work_that_succeeded_anew(store: Store) -> None:
    """``replay=False`` (a sampled request): no finished result; it owns the work, and a
    third identical request joins it in flight."""
    primary = await run_one(store, fingerprint="fp")
    await finish(store, primary, S.SUCCEEDED, result={"sample": 1})
    fresh = await submit(store, NOW + 2, fingerprint="fp", replay=False)
    assert (fresh.status, fresh.waits_for, fresh.result) == (S.QUEUED, None, None)
    joined = await submit(store, NOW + 3, fingerprint="fp", replay=False)
    assert (joined.status, joined.waits_for) == (S.QUEUED, fresh.id)
    (claimed,) = await claim(store, NOW + 4, token="tok-2")
    assert claimed.id == fresh.id
    await finish(store, claimed, S.SUCCEEDED, NOW + 5, result={"sample": 2})
    assert (await load(store, joined.id)).result == {"sample": 2}
    retried = await submit(store, NOW + 6, fingerprint="fp")  # replay: the latest result
    assert (retried.status, retried.result) == (S.DEDUPED, {"sample": 2})


async def test_fingerprint_in_flight_waits_then_takes_the_result(store: Store) -> None:
    primary = await submit(store, fingerprint="fp")
    dup = await submit(store, NOW + 1, fingerprint="fp")
    assert (dup.status, dup.waits_for, dup.duplicate_of) == (S.QUEUED, primary.id, primary.id)
    ready = await store.ready(ReadyQuery(KINDS, NOW + 5, 10))
    assert [c.task_id for c in ready] == [primary.id]
    claimed = await claim(store, NOW + 5)
    assert [t.id for t in claimed] == [primary.id]
    (applied,) = await store.complete(
        [Completion(primary.id, S.SUCCEEDED, lease_token="tok-1", result="same answer")],
        NOW + 6,
    )
    assert applied.released == (dup.id,)
    got = await load(store, dup.id)
    assert (got.status, got.result, got.waits_for, got.duplicate_of) == (
        S.DEDUPED,
        "same answer",
        None,
        primary.id,
    )
    assert got.finished_at == NOW + 6


@pytest.mark.parametrize("end", ["failed", "dead", "timeout", "cancelled"])
async def test_fingerprint_waiter_is_promoted_when_the_primary_does_not_succeed(
    store: Store, end: str
) -> None:
    primary = await submit(store, fingerprint="fp")
    heir = await submit(store, NOW + 1, fingerprint="fp")
    third = await submit(store, NOW + 2, fingerprint="fp")
    if end == "cancelled":
        await store.request_cancel(primary.id, None, NOW + 3)
    elif end == "timeout":
        await store.complete([Completion(primary.id, S.TIMEOUT, expected=S.QUEUED)], NOW + 3)
    else:
        running = (await claim(store, NOW + 3, ids=(primary.id,)))[0]
        (applied,) = await store.complete(
            [Completion(primary.id, S(end), lease_token=running.lease_token, error=fail())],
            NOW + 3,
        )
        assert applied.released == (heir.id,)
    promoted = await load(store, heir.id)
    assert (promoted.status, promoted.waits_for, promoted.duplicate_of) == (S.QUEUED, None, None)
    assert (await load(store, third.id)).waits_for == heir.id
    assert [t.id for t in await claim(store, NOW + 4)] == [heir.id]
    # the heir now owns the work: its success resolves the remaining waiter
    await finish(store, (await load(store, heir.id)), S.SUCCEEDED, NOW + 5, result=1)
    assert (await load(store, third.id)).status is S.DEDUPED


async def test_fingerprint_is_freed_when_the_primary_fails_alone(store: Store) -> None:
    primary = await run_one(store, fingerprint="fp")
    await finish(store, primary, S.FAILED, error=fail())
    again = await submit(store, NOW + 2, fingerprint="fp")
    assert (again.status, again.waits_for) == (S.QUEUED, None)


async def test_concurrent_duplicates_have_exactly_one_owner(backend: Backend) -> None:
    async with backend.opened() as a, backend.opened() as b:
        subs = await asyncio.gather(*[s.submit([task(fingerprint="fp")], NOW) for s in [a, b] * 6])
        tasks = [s[0].task for s in subs]
        owners = [t for t in tasks if t.waits_for is None]
        assert len(owners) == 1
        assert all(t.waits_for == owners[0].id for t in tasks if t is not owners[0])


@pytest.mark.parametrize("end", [S.SUCCEEDED, S.FAILED])
async def test_a_completing_primary_and_new_duplicates_never_orphan_a_waiter(
    backend: Backend, end: Status
) -> None:
    async with backend.opened() as a, backend.opened() as b:
        for round_ in range(4):
            fp = f"fp-{round_}"
            primary = await run_one(a, fingerprint=fp)
            outcome: dict[str, Any] = {"result": "r"} if end is S.SUCCEEDED else {"error": fail()}
            done = Completion(primary.id, end, lease_token="tok-1", **outcome)
            completing = asyncio.ensure_future(a.complete([done], NOW + 1))
            subs = await asyncio.gather(
                *[s.submit([task(fingerprint=fp)], NOW + 1) for s in [b, a] * 4]
            )
            assert (await completing)[0].applied
            dups = [await load(a, s[0].task.id) for s in subs]
            if end is S.SUCCEEDED:
                assert all(d.status is S.DEDUPED and d.result == "r" for d in dups), dups
            else:
                owners = [d for d in dups if d.waits_for is None]
                assert len(owners) == 1, dups
                assert all(d.waits_for == owners[0].id for d in dups if d is not owners[0])
                assert all(d.status is S.QUEUED for d in dups)
                # end the work, so the next round starts from a clean queue
                await a.request_cancel(owners[0].id, None, NOW + 2)


# -- interactive depth ----------------------------------------------------------------------


async def test_interactive_depth_refuses_and_writes_nothing(store: Store) -> None:
    def interactive(tenant: str = "acme") -> NewTask:
        return task(lane=Lane.INTERACTIVE, interactive_depth=2, tenant=tenant)

    first = (await store.submit([interactive(), interactive()], NOW))[0].task
    with pytest.raises(AdmissionRefused) as info:
        await store.submit([interactive()], NOW)
    assert info.value.limit == "interactive_depth" and info.value.retry_after > 0
    assert "acme" in str(info.value)
    assert await count(store) == 2
    with pytest.raises(AdmissionRefused):  # one refusal undoes the whole batch
        await store.submit([task(n=9), interactive()], NOW)
    assert await count(store) == 2
    await store.submit([interactive("other"), task(tenant="acme")], NOW)  # other dimensions
    running = (await claim(store, NOW, ids=(first.id,)))[0]
    await finish(store, running, S.SUCCEEDED)
    await store.submit([interactive()], NOW + 2)  # room again


async def test_interactive_depth_holds_under_concurrent_submitters(backend: Backend) -> None:
    async with backend.opened() as a, backend.opened() as b:
        new = task(lane=Lane.INTERACTIVE, interactive_depth=3)
        results = await asyncio.gather(
            *[s.submit([new], NOW) for s in [a, b] * 5], return_exceptions=True
        )
        refused = [r for r in results if isinstance(r, AdmissionRefused)]
        assert len(refused) == 7, results
        assert await count(a) == 3


async def test_past_the_interactive_depth_an_overflowing_task_goes_in_the_background_lane(
    backend: Backend,
) -> None:
    """Decided with its insert: nothing is refused, so nothing rolls back."""
    async with backend.opened() as a, backend.opened() as b:
        new = task(lane=Lane.INTERACTIVE, interactive_depth=3, overflow=True)
        results = await asyncio.gather(*[s.submit([new], NOW) for s in [a, b] * 5])
        lanes = [r[0].task.lane for r in results]
        assert lanes.count(Lane.INTERACTIVE) == 3 and lanes.count(Lane.BACKGROUND) == 7
        assert await count(a) == 10


# -- claim ------------------------------------------------------------------------------------


async def test_claim_counts_the_attempt_and_sets_the_lease(store: Store) -> None:
    t = await submit(store)
    (got,) = await claim(store, NOW + 1, owner="w9", token="tk", lease_s=30)
    assert got.id == t.id
    assert (got.status, got.attempts, got.lease_owner, got.lease_token) == (
        S.RUNNING,
        1,
        "w9",
        "tk",
    )
    assert (got.lease_expires_at, got.started_at, got.updated_at) == (NOW + 31, NOW + 1, NOW + 1)
    assert await load(store, t.id) == got
    last = (await store.events(t.id))[-1]
    assert (last.status, last.attempt, last.detail, last.at) == (S.RUNNING, 1, "w9", NOW + 1)
    assert await claim(store, NOW + 2) == []


async def test_claim_takes_interactive_first_then_fifo(store: Store) -> None:
    bg1 = await submit(store, NOW)
    bg2 = await submit(store, NOW + 1)
    in1 = await submit(store, NOW + 2, lane=Lane.INTERACTIVE)
    in2 = await submit(store, NOW + 3, lane=Lane.INTERACTIVE)
    order = [(await claim(store, NOW + 10, 1))[0].id for _ in range(4)]
    assert order == [in1.id, in2.id, bg1.id, bg2.id]


async def test_ready_lists_in_dispatch_order_without_claiming(store: Store) -> None:
    bg = await submit(store, NOW, cost_estimated=3)
    inter = await submit(store, NOW + 1, lane=Lane.INTERACTIVE, tenant="x")
    await submit(store, NOW + 2, kind="unknown")
    await submit(store, NOW + 3, fingerprint="fp")
    await submit(store, NOW + 4, fingerprint="fp")  # waits: not ready
    later = await submit(store, NOW + 100)  # not yet due at NOW + 5
    ready = await store.ready(ReadyQuery(KINDS, NOW + 5, 10))
    assert [c.task_id for c in ready][:2] == [inter.id, bg.id]
    assert len(ready) == 3 and later.id not in {c.task_id for c in ready}
    c = ready[1]
    assert (c.kind, c.tenant, c.lane, c.cost, c.seq, c.rank_at, c.deadline_at) == (
        "echo",
        "default",
        Lane.BACKGROUND,
        3,
        bg.seq,
        NOW,
        None,
    )
    assert (await load(store, bg.id)).status is S.QUEUED


async def test_ready_lists_up_to_limit_tasks_of_each_tenant(store: Store) -> None:
    big = [await submit(store, NOW + i, tenant="big", n=i) for i in range(6)]
    small = [await submit(store, NOW + 10 + i, tenant="small", n=i) for i in range(2)]
    urgent = await submit(store, NOW + 20, tenant="late", lane=Lane.INTERACTIVE)
    ready = await store.ready(ReadyQuery(KINDS, NOW + 30, 3))
    assert [c.task_id for c in ready] == [urgent.id] + [t.id for t in big[:3] + small]


async def test_a_lane_is_served_in_rank_order_then_seq(store: Store) -> None:
    # A job's later step ranks as of its job's submit: ahead of work submitted after the job,
    # behind work submitted before it, and behind the interactive lane all the same.
    before = await submit(store, NOW, n=1)
    after = await submit(store, NOW + 2, n=2)
    same_instant = await submit(store, NOW + 1, n=3)
    step = await submit(store, NOW + 5, n=4, rank_at=NOW + 1)
    urgent = await submit(store, NOW + 6, n=5, lane=Lane.INTERACTIVE)
    expected = [urgent.id, before.id, same_instant.id, step.id, after.id]
    ready = await store.ready(ReadyQuery(KINDS, NOW + 10, 10))
    assert [c.task_id for c in ready] == expected
    assert [c.rank_at for c in ready] == [NOW + 6, NOW, NOW + 1, NOW + 1, NOW + 2]
    assert [t.id for t in await claim(store, NOW + 10, 10)] == expected


async def test_a_claim_by_ids_comes_back_in_rank_order(store: Store) -> None:
    late = await submit(store, NOW, n=1, rank_at=NOW + 3)
    early = await submit(store, NOW + 1, n=2)
    got = await claim(store, NOW + 10, ids=(late.id, early.id))
    assert [t.id for t in got] == [early.id, late.id]


async def test_the_rank_migration_ranks_a_job_s_steps_at_their_job_s_submit(
    backend: Backend, store: Store
) -> None:
    # As migration 033 found a ledger: a job's step queued after a plain task, no rank yet.
    plain = await submit(store, NOW, n=1)
    step = await submit(store, NOW + 5, n=2)
    (ranks,) = [sql for v, _, sql in load_migrations(f"floodway.store.{backend.name}.migrations")
                if v == 33]  # fmt: skip
    backfill = [s for s in ranks.split(";") if "UPDATE tasks SET rank_at" in s]
    await backend.run(
        [
            "INSERT INTO jobs (id, tenant, status, lane, spec, created_at, updated_at) "
            f"VALUES ('j_1', 'default', 'running', 'background', '{{}}', {NOW - 1}, {NOW - 1})",
            "INSERT INTO job_tasks (task_id, job_id, step, idx) "
            f"VALUES ('{step.id}', 'j_1', 's', 0)",
            "UPDATE tasks SET rank_at = 0",
            *backfill,
        ]
    )
    ready = await store.ready(ReadyQuery(KINDS, NOW + 10, 10))
    assert [(c.task_id, c.rank_at) for c in ready] == [(step.id, NOW - 1), (plain.id, NOW)]


async def test_claim_respects_next_attempt_at(store: Store) -> None:
    t = await run_one(store)
    await finish(store, t, S.RETRYING, NOW + 1, next_attempt_at=NOW + 60, error=fail())
    fresh = await submit(store, NOW + 2)
    assert [x.id for x in await claim(store, NOW + 30)] == [fresh.id]
    (again,) = await claim(store, NOW + 60)
    assert (again.id, again.attempts) == (t.id, 2)


async def test_claim_filters_kinds_and_honours_limit(store: Store) -> None:
    await store.submit([task("echo", i) for i in range(5)] + [task("other")], NOW)
    assert {t.kind for t in await claim(store, kinds=("other",))} == {"other"}
    assert len(await claim(store, limit=3, kinds=("echo",))) == 3
    assert await claim(store, kinds=("nothing",)) == []
    assert len(await claim(store, limit=10)) == 2


async def test_claim_by_ids_takes_only_those_that_are_claimable(store: Store) -> None:
    a, b, c = [await submit(store, NOW + i, n=i) for i in range(3)]
    got = await claim(store, ids=(c.id, a.id, "t_missing"))
    assert [t.id for t in got] == [a.id, c.id]  # dispatch order
    assert await claim(store, ids=(a.id,)) == []  # already running
    waiter_owner = await submit(store, fingerprint="fp")
    waiter = await submit(store, fingerprint="fp")
    assert [t.id for t in await claim(store, ids=(waiter.id, waiter_owner.id))] == [waiter_owner.id]
    assert (await load(store, b.id)).status is S.QUEUED


async def test_no_task_is_claimed_twice_by_concurrent_claimers(backend: Backend) -> None:
    async with backend.opened() as a, backend.opened() as b:
        await a.submit([task(n=i) for i in range(120)], NOW)

        async def claimer(store: Store, n: int) -> list[str]:
            got: list[str] = []
            while batch := await claim(store, NOW + 1, 3, token=f"tok-{n}"):
                got += [t.id for t in batch]
            return got

        runs = await asyncio.gather(*[claimer(s, i) for i, s in enumerate([a, b] * 10)])
        ids = [i for run in runs for i in run]
        assert len(ids) == len(set(ids)) == 120
        assert (await a.stats()).by_status["running"] == 120
        assert {t.attempts for t in await a.list_tasks(TaskQuery(limit=500))} == {1}


# -- complete -------------------------------------------------------------------------------


async def test_complete_writes_result_and_status_together(store: Store) -> None:
    t = await run_one(store)
    (applied,) = await store.complete(
        [Completion(t.id, S.SUCCEEDED, lease_token="tok-1", result=[1, 2], cost_actual=7.5)],
        NOW + 1,
    )
    assert (applied.applied, applied.status) == (True, S.SUCCEEDED)
    got = await load(store, t.id)
    assert (got.status, got.result, got.cost_actual, got.finished_at) == (
        S.SUCCEEDED,
        [1, 2],
        7.5,
        NOW + 1,
    )
    assert (got.lease_owner, got.lease_token, got.lease_expires_at) == (None, None, None)
    last = (await store.events(t.id))[-1]
    assert (last.status, last.attempt, last.at) == (S.SUCCEEDED, 1, NOW + 1)


async def test_readers_never_see_status_without_its_result(backend: Backend) -> None:
    async with backend.opened() as writer, backend.opened() as reader:
        tasks = [await run_one(writer, n=i) for i in range(10)]
        seen: list[Task] = []

        async def watch() -> None:
            for _ in range(30):
                seen.extend(t for t in await reader.list_tasks(TaskQuery()))

        await asyncio.gather(
            watch(),
            *[
                writer.complete(
                    [Completion(t.id, S.SUCCEEDED, lease_token="tok-1", result={"i": t.id})],
                    NOW + 1,
                )
                for t in tasks
            ],
        )
        for t in seen:
            assert (t.status is S.SUCCEEDED) == (t.result == {"i": t.id}), t


async def test_complete_records_the_error_and_the_event_detail(store: Store) -> None:
    t = await run_one(store)
    got = await finish(store, t, S.FAILED, error=fail("upstream said no"))
    assert got.error == fail("upstream said no")
    last = (await store.events(t.id))[-1]
    assert (last.status, last.detail) == (S.FAILED, "upstream said no")


async def test_complete_is_a_compare_and_set_on_status_and_token(store: Store) -> None:
    t = await run_one(store)
    wrong = await store.complete(
        [
            Completion(t.id, S.SUCCEEDED, lease_token="not-mine"),
            Completion(t.id, S.TIMEOUT, expected=S.QUEUED),
            Completion("t_missing", S.SUCCEEDED, lease_token="tok-1"),
        ],
        NOW + 1,
    )
    assert [(a.applied, a.status) for a in wrong] == [
        (False, S.RUNNING),
        (False, S.RUNNING),
        (False, None),
    ]
    assert await load(store, t.id) == t
    assert len(await store.events(t.id)) == 2


async def test_a_zombie_cannot_overwrite_a_task_claimed_again(store: Store) -> None:
    t = await run_one(store)  # token tok-1, lease until NOW + 30
    (expired,) = await store.expired_leases(NOW + 31, 10)
    rescued = await store.complete(
        [Completion(expired.id, S.RETRYING, lease_token="tok-1", next_attempt_at=NOW + 31)],
        NOW + 31,
    )
    assert rescued[0].applied
    (again,) = await claim(store, NOW + 32, token="tok-2")
    (zombie,) = await store.complete(
        [Completion(t.id, S.SUCCEEDED, lease_token="tok-1", result="stale")], NOW + 33
    )
    assert (zombie.applied, zombie.status) == (False, S.RUNNING)
    got = await load(store, t.id)
    assert (got.lease_token, got.result, got.attempts) == ("tok-2", None, 2)
    await finish(store, again, S.SUCCEEDED, NOW + 34, result="fresh")


async def test_illegal_transition_raises_before_writing(store: Store) -> None:
    t = await run_one(store)
    other = await run_one(store, n=2)
    with pytest.raises(IllegalTransition):
        await store.complete(
            [
                Completion(other.id, S.SUCCEEDED, lease_token="tok-1"),
                Completion(t.id, S.QUEUED, lease_token="tok-1"),
            ],
            NOW + 1,
        )
    with pytest.raises(IllegalTransition):  # a running task needs its lease
        await store.complete([Completion(t.id, S.SUCCEEDED)], NOW + 1)
    assert (await load(store, other.id)).status is S.RUNNING
    assert (await load(store, t.id)).status is S.RUNNING


async def test_refund_attempt_and_invalid_output_counters(store: Store) -> None:
    t = await run_one(store)
    throttled = await finish(
        store, t, S.RETRYING, NOW + 1, refund_attempt=True, next_attempt_at=NOW + 1
    )
    assert throttled.attempts == 0
    (t2,) = await claim(store, NOW + 2)
    assert t2.attempts == 1
    bad = await finish(store, t2, S.RETRYING, NOW + 3, invalid_output=True, next_attempt_at=NOW + 3)
    assert (bad.attempts, bad.invalid_outputs, bad.finished_at) == (1, 1, None)


# -- heartbeat, upstream refs, parking --------------------------------------------------------


async def test_heartbeat_extends_leases_and_reports_lost_and_cancelled(store: Store) -> None:
    a = await run_one(store)
    b = await run_one(store, n=2)
    await store.request_cancel(b.id, None, NOW + 1)
    beat = await store.heartbeat(
        [(a.id, "tok-1"), (b.id, "tok-1"), ("t_missing", "tok-1")], NOW + 10, 30
    )
    assert beat.lost == ("t_missing",)
    assert beat.cancel_requested == (b.id,)
    assert (await load(store, a.id)).lease_expires_at == NOW + 40
    beat = await store.heartbeat([(a.id, "stolen")], NOW + 11, 30)
    assert beat.lost == (a.id,)
    assert (await load(store, a.id)).lease_expires_at == NOW + 40
    assert (await store.heartbeat([], NOW, 30)).lost == ()


async def test_upstream_ref_needs_the_lease_and_is_found_again(store: Store) -> None:
    t = await run_one(store)
    assert not await store.set_upstream_ref(t.id, "not-mine", "job-1", NOW + 1)
    assert await store.set_upstream_ref(t.id, "tok-1", "job-1", NOW + 1)
    found = await store.find_upstream("echo", "job-1")
    assert found is not None and found.id == t.id
    assert await store.find_upstream("other", "job-1") is None


async def test_park_frees_the_lease_until_the_poll_is_due(store: Store) -> None:
    t = await run_one(store)
    assert not await store.park(t.id, "not-mine", "job", NOW + 50, NOW + 1)
    assert await store.park(t.id, "tok-1", "job", NOW + 50, NOW + 1)
    parked = await load(store, t.id)
    assert (parked.status, parked.parked, parked.lease_token) == (S.RUNNING, True, None)
    assert (parked.upstream_ref, parked.next_attempt_at) == ("job", NOW + 50)
    assert await store.next_parked_at() == NOW + 50
    assert (await store.heartbeat([(t.id, "tok-1")], NOW + 2, 30)).lost == (t.id,)
    assert await store.expired_leases(NOW + 1000, 10) == []
    poll = ClaimParams("poller", "tok-p", KINDS, 10, NOW + 49, 30)
    assert await store.claim_parked(poll) == []
    (woken,) = await store.claim_parked(ClaimParams("poller", "tok-p", KINDS, 10, NOW + 50, 30))
    assert (woken.parked, woken.lease_token, woken.attempts) == (False, "tok-p", 1)
    assert await store.next_parked_at() is None
    assert await store.park(t.id, "tok-p", "job", NOW + 90, NOW + 51, polled=True)
    assert (await load(store, t.id)).poll_attempts == 1


async def test_hasten_parked_makes_a_kind_s_old_enough_polls_due(store: Store) -> None:
    late, due = await run_one(store), await run_one(store)
    young = await run_one(store, now=NOW + 8)
    other = await run_one(store, kind="other")
    for t, at in ((late, NOW + 50), (due, NOW + 9), (young, NOW + 50), (other, NOW + 50)):
        assert await store.park(t.id, "tok-1", "job", at, NOW + 8)
    # At NOW + 10, jobs at least 5 s old: the late one is due now; the one due already, the
    # one 2 s old and another kind's keep their polls.
    assert await store.hasten_parked("echo", 5.0, NOW + 10) == 1
    assert (await load(store, late.id)).next_attempt_at == NOW + 10
    assert (await load(store, due.id)).next_attempt_at == NOW + 9
    assert (await load(store, young.id)).next_attempt_at == NOW + 50
    assert (await load(store, other.id)).next_attempt_at == NOW + 50
    assert await store.hasten_parked("echo", 5.0, NOW + 10) == 0


async def test_a_cancel_makes_a_parked_task_s_poll_due_at_once(store: Store) -> None:
    """The poller then cancels the upstream job now, not at the next poll."""
    t = await run_one(store)
    assert await store.park(t.id, "tok-1", "job", NOW + 600, NOW + 1)
    cancelling = await store.request_cancel(t.id, None, NOW + 2)
    assert (cancelling.status, cancelling.cancel_requested) == (S.RUNNING, True)
    assert await store.next_parked_at() == NOW + 2
    (woken,) = await store.claim_parked(ClaimParams("poller", "tok-p", KINDS, 10, NOW + 2, 30))
    assert woken.id == t.id and woken.cancel_requested
    # A running task that is not parked keeps its schedule: its worker gets the signal.
    u = await run_one(store)
    before = (await load(store, u.id)).next_attempt_at
    await store.request_cancel(u.id, None, NOW + 3)
    assert (await load(store, u.id)).next_attempt_at == before


async def test_a_parked_task_is_completed_by_the_first_webhook_only(store: Store) -> None:
    t = await run_one(store)
    not_parked = await store.complete(
        [Completion(t.id, S.SUCCEEDED, parked=True, result="early")], NOW + 1
    )
    assert not not_parked[0].applied
    await store.park(t.id, "tok-1", "job", NOW + 50, NOW + 1)
    first, second = await store.complete(
        [
            Completion(t.id, S.SUCCEEDED, parked=True, result="hook"),
            Completion(t.id, S.FAILED, parked=True, error=fail("poll")),
        ],
        NOW + 2,
    )
    assert (first.applied, second.applied, second.status) == (True, False, S.SUCCEEDED)
    got = await load(store, t.id)
    assert (got.status, got.result, got.parked) == (S.SUCCEEDED, "hook", False)


# -- callbacks ---------------------------------------------------------------------------------


async def test_a_terminal_task_with_a_callback_url_enters_the_outbox(store: Store) -> None:
    t = await run_one(store, callback_url="http://cb")
    await run_one(store, n=2)  # no callback_url: never in the outbox
    assert await store.due_callbacks(NOW + 100, 10) == []
    await finish(store, t, S.SUCCEEDED, NOW + 1, result=1)
    (due,) = await store.due_callbacks(NOW + 1, 10)
    assert (due.id, due.callback_state) == (t.id, "pending")
    await store.callback_result(t.id, "pending", NOW + 20)
    assert await store.due_callbacks(NOW + 19, 10) == []
    (due,) = await store.due_callbacks(NOW + 20, 10)
    assert due.callback_attempts == 1
    await store.callback_result(t.id, "delivered", None)
    got = await load(store, t.id)
    assert (got.callback_state, got.callback_attempts) == ("delivered", 2)
    assert await store.due_callbacks(NOW + 1000, 10) == []


async def test_deduped_and_cancelled_tasks_also_enter_the_outbox(store: Store) -> None:
    done = await run_one(store, fingerprint="fp")
    await finish(store, done, S.SUCCEEDED, result=1)
    dup = await submit(store, NOW + 2, fingerprint="fp", callback_url="http://cb")
    gone = await submit(store, NOW + 2, n=5, callback_url="http://cb")
    await store.request_cancel(gone.id, None, NOW + 3)
    due = {t.id for t in await store.due_callbacks(NOW + 3, 10)}
    assert due == {dup.id, gone.id}


# -- requests from people -------------------------------------------------------------------


async def test_cancel_a_queued_task_at_once(store: Store) -> None:
    t = await submit(store)
    got = await store.request_cancel(t.id, "default", NOW + 1)
    assert (got.status, got.finished_at) == (S.CANCELLED, NOW + 1)
    assert got.error is not None and got.error.cls is ErrorClass.CANCELLED
    assert (await store.events(t.id))[-1].status is S.CANCELLED
    assert await claim(store, NOW + 2) == []


async def test_cancel_a_running_task_ends_it_and_keeps_its_attempt_for_its_worker(
    store: Store,
) -> None:
    """The call was sent: the task ends now, its worker keeps the lease, is told by its next
    heartbeat, and closes the attempt with the call's answer once it has read it."""
    t = await run_one(store)
    got = await store.request_cancel(t.id, None, NOW + 1)
    assert got.status is S.CANCELLED and got.lease_token == t.lease_token
    beat = await store.heartbeat([(t.id, "tok-1")], NOW + 2, 30)
    assert beat.lost == () and beat.cancel_requested == (t.id,)
    item = Completion(t.id, S.SUCCEEDED, lease_token=t.lease_token, result={"late": 1})
    (applied,) = await store.complete([item], NOW + 3)
    assert not applied.applied and applied.closed
    done = await load(store, t.id)
    assert done.status is S.CANCELLED and done.lease_token is None
    assert done.result == {"late": 1}


async def test_cancel_refuses_terminal_and_foreign_tasks(store: Store) -> None:
    t = await run_one(store)
    await finish(store, t, S.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        await store.request_cancel(t.id, None, NOW + 2)
    other = await submit(store, tenant="b")
    with pytest.raises(TaskNotFound):
        await store.request_cancel(other.id, "a", NOW + 2)
    with pytest.raises(TaskNotFound):
        await store.request_cancel("t_missing", None, NOW + 2)
    assert (await load(store, other.id)).status is S.QUEUED


@pytest.mark.parametrize("end", [S.FAILED, S.DEAD, S.TIMEOUT])
async def test_manual_retry_gives_a_fresh_budget(store: Store, end: Status) -> None:
    t = await run_one(store, deadline_s=100)
    await finish(store, t, end, NOW + 1, error=fail(), invalid_output=True)
    got = await store.manual_retry(t.id, "default", NOW + 500)
    assert (got.status, got.attempts, got.invalid_outputs) == (S.QUEUED, 0, 0)
    assert (got.result, got.error, got.finished_at) == (None, None, None)
    assert (got.next_attempt_at, got.deadline_at) == (NOW + 500, NOW + 600)
    last = (await store.events(t.id))[-1]
    assert (last.status, last.detail) == (S.QUEUED, "manual retry")
    assert [x.id for x in await claim(store, NOW + 500)] == [t.id]


async def test_manual_retry_refuses_other_states(store: Store) -> None:
    t = await run_one(store)
    with pytest.raises(IllegalTransition):
        await store.manual_retry(t.id, None, NOW + 1)
    await finish(store, t, S.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        await store.manual_retry(t.id, None, NOW + 2)
    with pytest.raises(TaskNotFound):
        await store.manual_retry(t.id, "someone-else", NOW + 2)
    assert (await load(store, t.id)).status is S.SUCCEEDED


# -- maintenance ------------------------------------------------------------------------------


async def test_expired_leases_and_past_deadline(store: Store) -> None:
    a = await run_one(store)  # lease until NOW + 30
    b = await run_one(store, NOW + 5, n=2)  # lease until NOW + 35
    late = await submit(store, deadline_s=10, n=3)
    await submit(store, n=4)  # no deadline
    assert await store.expired_leases(NOW + 29, 10) == []
    assert [t.id for t in await store.expired_leases(NOW + 40, 10)] == [a.id, b.id]
    assert len(await store.expired_leases(NOW + 40, 1)) == 1
    assert await store.past_deadline(NOW + 10, 10) == []
    assert [t.id for t in await store.past_deadline(NOW + 11, 10)] == [late.id]


async def test_purge_clears_results_then_rows_then_keys(store: Store) -> None:
    old = await run_one(store, request_key="k", request_hash="h", key_ttl_s=100)
    await finish(store, old, S.SUCCEEDED, NOW + 1, result="big")
    live = await submit(store, NOW + 1, n=2)
    purged = await store.purge(Retention(NOW + 50, result_ttl_s=10, row_ttl_s=1000))
    assert (purged.results_cleared, purged.rows_deleted, purged.keys_expired) == (1, 0, 0)
    assert (await load(store, old.id)).result is None
    purged = await store.purge(Retention(NOW + 2000, result_ttl_s=10, row_ttl_s=1000))
    assert (purged.rows_deleted, purged.keys_expired) == (1, 1)
    assert await store.get(old.id) is None
    assert await store.events(old.id) == []
    assert await store.get(live.id) is not None
    again = (await store.submit([task(request_key="k", request_hash="h")], NOW + 2000))[0]
    assert not again.reused


async def test_the_first_server_key_stored_is_the_one_every_process_gets(store: Store) -> None:
    first = await store.server_key("cursors", "aa" * 64)
    again = await store.server_key("cursors", "bb" * 64)  # another process, its own guess
    assert first == again == "aa" * 64
    assert await store.server_key("other", "cc") == "cc"


async def test_try_lead_elects_one_leader_until_its_lease_ends(store: Store) -> None:
    assert await store.try_lead("sweeper", "a", NOW, 10)
    assert not await store.try_lead("sweeper", "b", NOW + 5, 10)
    assert await store.try_lead("sweeper", "a", NOW + 9, 10)  # renew to NOW + 19
    assert not await store.try_lead("sweeper", "b", NOW + 15, 10)
    assert await store.try_lead("other-job", "b", NOW + 15, 10)
    assert await store.try_lead("sweeper", "b", NOW + 20, 10)  # takeover after expiry
    assert not await store.try_lead("sweeper", "a", NOW + 21, 10)


# -- reading ----------------------------------------------------------------------------------


async def test_list_tasks_filters_and_pages_by_seq(store: Store) -> None:
    await store.submit(
        [task(tenant="a", batch_id="b1", n=i) for i in range(5)]
        + [task("other", tenant="b"), task(tenant="a", lane=Lane.INTERACTIVE)],
        NOW,
    )
    await claim(store, kinds=("other",))
    assert len(await store.list_tasks(TaskQuery())) == 7
    assert len(await store.list_tasks(TaskQuery(tenant="a"))) == 6
    assert len(await store.list_tasks(TaskQuery(batch_id="b1"))) == 5
    assert [t.kind for t in await store.list_tasks(TaskQuery(status=S.RUNNING))] == ["other"]
    assert len(await store.list_tasks(TaskQuery(kind="echo", lane=Lane.INTERACTIVE))) == 1
    pages: list[list[Task]] = []
    after: int | None = None
    while page := await store.list_tasks(TaskQuery(tenant="a", after_seq=after, limit=4)):
        pages.append(page)
        after = page[-1].seq
    seqs = [t.seq for p in pages for t in p]
    assert [len(p) for p in pages] == [4, 2]
    assert seqs == sorted(seqs) and len(set(seqs)) == 6


async def test_batches_lists_a_tenants_newest_batches_with_their_counts(store: Store) -> None:
    await store.submit([task(tenant="a", batch_id="old", n=i) for i in range(3)], NOW)
    await store.submit([task(tenant="b", batch_id="theirs", n=i) for i in range(2)], NOW + 1)
    await store.submit([task(tenant="a", batch_id="new", n=10 + i) for i in range(2)], NOW + 2)
    await store.submit([task(tenant="a", n=99)], NOW + 3)  # in no batch
    (running,) = await claim(store, NOW + 4, 1)
    assert running.batch_id == "old"
    found = await store.batches("a", 10)
    assert [b.batch_id for b in found] == ["new", "old"]
    assert found[0].counts == {"queued": 2} and found[0].created_at == NOW + 2
    assert found[1].counts == {"queued": 2, "running": 1} and found[1].created_at == NOW
    assert [b.batch_id for b in await store.batches("a", 1)] == ["new"]
    assert [b.batch_id for b in await store.batches("b", 10)] == ["theirs"]
    assert await store.batches("nobody", 10) == []


async def test_workers_are_listed_with_the_tasks_they_hold(store: Store) -> None:
    def worker(owner: str) -> WorkerInfo:
        return WorkerInfo(owner, "host-1", 42, 8, ("echo",), NOW, NOW)

    await store.worker_beat(worker("w1"), NOW, 3600)
    await store.worker_beat(worker("w2"), NOW, 3600)
    await store.worker_beat(worker("w1"), NOW + 10, 3600)  # a heartbeat
    held = await run_one(store, NOW + 11)  # claimed by owner "w1"
    await submit(store, NOW + 11, n=2)  # queued: nobody's
    found = {w.owner: w for w in await store.workers(NOW)}
    assert set(found) == {"w1", "w2"}
    assert found["w1"].heartbeat_at == NOW + 10 and found["w1"].started_at == NOW
    assert (found["w1"].host, found["w1"].pid, found["w1"].kinds) == ("host-1", 42, ("echo",))
    assert [(t.task_id, t.attempt, t.since) for t in found["w1"].tasks] == [(held.id, 1, NOW + 11)]
    assert found["w2"].tasks == ()
    assert [w.owner for w in await store.workers(NOW + 5)] == ["w1"]  # w2 silent since NOW
    await store.worker_gone("w1")
    assert [w.owner for w in await store.workers(NOW)] == ["w2"]
    await store.worker_beat(worker("w3"), NOW + 7200, 3600)  # w2 silent for over the hour
    assert [w.owner for w in await store.workers(0)] == ["w3"]


async def test_list_tasks_pages_newest_first_with_the_same_filters(store: Store) -> None:
    await store.submit(
        [task(tenant="a", n=i) for i in range(5)] + [task(tenant="b")] + [task(tenant="a", n=9)],
        NOW,
    )
    oldest_first = [t.seq for t in await store.list_tasks(TaskQuery(tenant="a"))]
    pages: list[list[int]] = []
    after: int | None = None
    while page := await store.list_tasks(
        TaskQuery(tenant="a", after_seq=after, limit=4, descending=True)
    ):
        pages.append([t.seq for t in page])
        after = page[-1].seq
    assert [len(p) for p in pages] == [4, 2]
    assert [seq for p in pages for seq in p] == oldest_first[::-1]


async def test_recent_timings_are_the_newest_tasks_with_their_times_and_error_type(
    store: Store,
) -> None:
    failed = await run_one(store, tenant="a", n=1)
    await finish(store, failed, S.FAILED, NOW + 2, error=fail())
    done = await run_one(store, NOW + 1, tenant="a", n=2)
    await finish(store, done, S.SUCCEEDED, NOW + 3)
    theirs = await submit(store, NOW + 4, tenant="b")
    newest = await store.recent_timings(None, 2)
    assert [t.id for t in newest] == [theirs.id, done.id]
    (d,) = [t for t in newest if t.id == done.id]
    assert (d.kind, d.status, d.error_type, d.attempts) == ("echo", S.SUCCEEDED, "", 1)
    assert (d.created_at, d.started_at, d.finished_at) == (NOW + 1, NOW + 1, NOW + 3)
    assert d.terminal and not newest[0].terminal
    mine = await store.recent_timings("a", 10)
    assert [(t.id, t.error_type) for t in mine] == [(done.id, ""), (failed.id, "fatal")]


async def test_events_come_in_order_and_page_by_seq(store: Store) -> None:
    t = await run_one(store)
    await finish(store, t, S.RETRYING, NOW + 1, next_attempt_at=NOW + 1, error=fail("x"))
    (t2,) = await claim(store, NOW + 2)
    await finish(store, t2, S.SUCCEEDED, NOW + 3)
    events = await store.events(t.id)
    assert [e.status for e in events] == [S.QUEUED, S.RUNNING, S.RETRYING, S.RUNNING, S.SUCCEEDED]
    assert [e.attempt for e in events] == [0, 1, 1, 2, 2]
    assert [e.at for e in events] == [NOW, NOW, NOW + 1, NOW + 2, NOW + 3]
    assert await store.events(t.id, after_seq=events[2].seq) == events[3:]


async def test_stats_count_by_status_and_kind(store: Store) -> None:
    await store.submit([task(n=i) for i in range(3)] + [task("other")], NOW)
    await claim(store, limit=1, kinds=("other",))
    stats = await store.stats()
    assert stats.by_status["queued"] == 3 and stats.by_status["running"] == 1
    assert stats.by_status["succeeded"] == 0
    assert stats.by_kind_status == {"echo": {"queued": 3}, "other": {"running": 1}}


async def test_listeners_hear_committed_changes_of_this_process(store: Store) -> None:
    heard: list[list[TaskChange]] = []
    store.add_listener(lambda changes: heard.append(list(changes)))
    t = await submit(store, request_key="k", request_hash="h")
    await submit(store, request_key="k", request_hash="h")  # reused: nothing changed
    await claim(store)
    await store.complete([Completion(t.id, S.SUCCEEDED, lease_token="tok-1")], NOW + 1)
    await store.complete([Completion(t.id, S.FAILED, lease_token="tok-1")], NOW + 2)  # no-op
    with pytest.raises(AdmissionRefused):
        await store.submit([task(lane=Lane.INTERACTIVE, interactive_depth=1)] * 2, NOW)
    assert heard == [
        [TaskChange(t.id, S.QUEUED, "default")],
        [TaskChange(t.id, S.RUNNING, "default")],
        [TaskChange(t.id, S.SUCCEEDED, "default")],
    ]


async def test_a_failing_write_undoes_only_itself_and_is_heard_once(store: Store) -> None:
    """Writes issued together share a transaction; one that fails must not undo the others,
    leave half of itself behind, or have the others' changes heard twice."""
    queued = await submit(store, n=0)
    running = await run_one(store, n=1)
    keyed = await submit(store, n=2, request_key="k", request_hash="h1")
    heard: list[TaskChange] = []
    store.add_listener(heard.extend)
    outcomes = await asyncio.gather(
        store.submit([task(n=3)], NOW + 1),
        store.request_cancel(queued.id, None, NOW + 1),
        store.submit([task(n=4), task(n=5, request_key="k", request_hash="h2")], NOW + 1),
        store.complete([Completion(running.id, S.SUCCEEDED, lease_token="tok-1")], NOW + 1),
        store.request_cancel("t_missing", None, NOW + 1),
        store.submit([task(n=6)], NOW + 1),
        return_exceptions=True,
    )
    fresh, cancelled, conflict, (done,), missing, other = outcomes
    assert isinstance(conflict, IdempotencyConflict) and conflict.task_id == keyed.id
    assert isinstance(missing, TaskNotFound)
    assert isinstance(cancelled, Task) and cancelled.status is S.CANCELLED
    assert done.applied
    assert await count(store) == 5  # n=0, 1, 2, 3, 6: nothing of the refused batch (n=4)
    new_ids = {fresh[0].task.id, other[0].task.id}
    assert sorted(heard, key=lambda c: c.task_id) == sorted(
        [
            TaskChange(queued.id, S.CANCELLED, "default"),
            TaskChange(running.id, S.SUCCEEDED, "default"),
            *(TaskChange(i, S.QUEUED, "default") for i in new_ids),
        ],
        key=lambda c: c.task_id,
    )


# -- another process's writes -----------------------------------------------------------------


async def drain(store: Store) -> None:
    """Consume the changes our own setup made, so the next wait starts quiet."""
    while await store.wait_for_change(0.05):
        pass


async def test_wait_for_change_wakes_on_another_store_s_submit(backend: Backend) -> None:
    async with backend.opened() as waiter, backend.opened() as other:
        await waiter.get("t_warm")
        await drain(waiter)
        assert not await waiter.wait_for_change(0.1)
        started = time.monotonic()
        waiting = asyncio.ensure_future(waiter.wait_for_change(5.0))
        await asyncio.sleep(0)
        await other.submit([task()], NOW)
        assert await waiting
        assert time.monotonic() - started < 5.0


async def test_another_store_s_claim_wakes_nobody_but_its_outcome_does(backend: Backend) -> None:
    """The notices are for dispatchers: a claim brings them no work and frees no slot (on
    PostgreSQL it sends none; SQLite cannot tell one write from another), a finished task
    frees a provider slot another process may take."""
    async with backend.opened() as waiter, backend.opened() as other:
        t = await submit(other)
        await waiter.get("t_warm")
        await drain(waiter)
        (running,) = await claim(other, ids=(t.id,))
        if backend.name == "postgres":
            assert not await waiter.wait_for_change(0.3)
        await drain(waiter)
        waiting = asyncio.ensure_future(waiter.wait_for_change(5.0))
        await asyncio.sleep(0)
        await finish(other, running, S.SUCCEEDED, result={"ok": True})
        assert await waiting


# -- schema, migrations, opening --------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True])
async def test_a_completions_effects_are_written_with_it_and_delivered_once(
    store: Store, batched: bool
) -> None:
    """A dead task's alert and a poison task's fallback are in the outbox the moment their
    write lands, in its transaction (the one-row and the many-row write alike); a write that
    does not land writes none."""
    dead, poison, fine = [await run_one(store, n=n) for n in range(3)]
    items = [
        Completion(dead.id, S.DEAD, lease_token=dead.lease_token, error=fail()),
        Completion(
            poison.id,
            S.FAILED,
            lease_token=poison.lease_token,
            error=ErrorInfo(ErrorClass.POISON, "invalid_output", "bad"),
        ),
        Completion(fine.id, S.SUCCEEDED, lease_token=fine.lease_token, result={"ok": 1}),
        Completion(dead.id, S.DEAD, lease_token="stale", error=fail()),
    ]
    for chunk in [items[:3], items[3:]] if batched else [[i] for i in items]:
        await store.complete(chunk, NOW + 1)
    assert await store.due_effects(NOW, 10) == []  # due from the write on, not before
    due = await store.due_effects(NOW + 1, 10)
    assert sorted((e.task.id, e.effect, e.attempts) for e in due) == sorted(
        [(dead.id, "alert", 0), (poison.id, "fallback", 0)]
    )
    assert {e.task.id: e.task.status for e in due} == {dead.id: S.DEAD, poison.id: S.FAILED}
    alert = next(e for e in due if e.effect == "alert")
    await store.effect_retry(alert.seq, NOW + 60)
    await store.effect_done(next(e.seq for e in due if e.effect == "fallback"))
    assert await store.due_effects(NOW + 2, 10) == []
    (again,) = await store.due_effects(NOW + 60, 10)
    assert (again.seq, again.attempts) == (alert.seq, 1)


def test_every_sqlite_query_has_a_postgres_twin() -> None:
    sqlite = load_queries("floodway.store.sqlite")
    postgres = load_queries("floodway.store.postgres")
    # Where one statement cannot write several tables, waiters are resolved an owner at a time;
    # PostgreSQL resolves every owner's in one (resolve_waiters_of).
    assert sorted(set(sqlite) - set(postgres)) == ["resolve_waiters"]


async def test_migrations_are_recorded_and_applied_once(backend: Backend, store: Store) -> None:
    package = f"floodway.store.{backend.name}.migrations"
    expected = [(version, name) for version, name, _ in load_migrations(package)]
    query = "SELECT version, name FROM schema_migrations ORDER BY version"
    assert [tuple(r) for r in await backend.fetch(query)] == expected
    async with backend.opened():  # a second start finds nothing to do
        pass
    assert [tuple(r) for r in await backend.fetch(query)] == expected


async def test_concurrent_starts_migrate_once(backend: Backend) -> None:
    # On SQLite this also covers the WAL switch, which answers "locked" at once (no
    # busy_timeout) when several processes open a fresh file together.
    stores = [backend.make() for _ in range(4)]
    try:
        await asyncio.gather(*[s.open() for s in stores])
        await stores[0].submit([task()], NOW)
        assert await count(stores[3]) == 1
    finally:
        for s in stores:
            await s.close()
    rows = await backend.fetch("SELECT version FROM schema_migrations")
    assert len(rows) == len(load_migrations(f"floodway.store.{backend.name}.migrations"))


async def test_opening_sqlite_in_a_missing_directory_says_so(tmp_path: Any) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/missing/dir/t.db")
    with pytest.raises(StoreError, match="does not exist"):
        await store.open()
    await store.close()


async def test_opening_postgres_on_a_closed_port_says_so() -> None:
    store = PostgresStore("postgresql://postgres:s3cret@127.0.0.1:1/test")
    with pytest.raises(StoreError, match=r"cannot connect to postgresql://postgres:\*\*\*@") as e:
        await store.open()
    assert "s3cret" not in str(e.value)
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        await store.get("t_x")


async def test_postgres_survives_its_connections_being_killed(backend: Backend) -> None:
    """What a server restart does to a running store: every connection dies at once."""
    if backend.name != "postgres":
        pytest.skip("a PostgreSQL connection-pool property")
    app = f"fw_{backend.schema}"
    url = f"{PG_URL}?application_name={app}"
    async with backend.opened(url) as store, backend.opened() as other:
        await submit(store)
        killed = await backend.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE application_name = '{app}'"
        )
        assert len(killed) == 3  # the listener and the pool's two
        assert await count(store) == 1  # the pool replaces its dead connections
        await submit(store, n=2)
        for _ in range(100):  # the listener reconnects on its own, after a short backoff
            listening = await backend.fetch(
                "SELECT pid FROM pg_stat_activity "
                f"WHERE application_name = '{app}' AND query LIKE 'LISTEN%'"
            )
            if listening:
                break
            await asyncio.sleep(0.05)
        assert listening
        await drain(store)  # includes the reconnected listener's "maybe changed"
        waiting = asyncio.ensure_future(store.wait_for_change(5.0))
        await asyncio.sleep(0)
        await other.submit([task(n=3)], NOW)
        assert await waiting  # and hears other processes again


async def test_batch_counts_per_status_scoped_to_the_tenant(store: Store) -> None:
    await store.submit([task(n=i, batch_id="b1", tenant="acme") for i in range(3)], NOW)
    await store.submit([task(n=9, batch_id="b2", tenant="acme")], NOW)
    claimed = await store.claim(ClaimParams("w", "tok", KINDS, 1, NOW, 30))
    assert await store.batch_counts("b1", "acme") == {"queued": 2, "running": 1} or (
        claimed[0].batch_id != "b1"
    )
    assert sum((await store.batch_counts("b1", None)).values()) == 3
    assert await store.batch_counts("b1", "other-tenant") == {}
    assert await store.batch_counts("nope", None) == {}


async def test_a_batch_lines_answer_expires_with_results_and_a_queued_line_stays(
    store: Store,
) -> None:
    records = cast(TierRecords, store)
    body: dict[str, object] = {"model": "m", "messages": []}
    await records.add_line("t-answered", "chat", "m", body, None, NOW, NOW)
    await records.add_line("t-queued", "chat", "m", {**body, "n": 2}, None, NOW, NOW)
    batch = await records.pack("chat", "m", 1, NOW)
    assert batch is not None
    await records.sent(batch.id, "batch_up", NOW)
    answered = LineResult("t-answered", True, {"ok": 1}, 3, 4)
    await records.end_batch(batch.id, [answered], NOW + 1)
    line = await records.get_line("t-answered")
    assert line is not None and (line.state, line.result, line.input_tokens) == (
        "done",
        {"ok": 1},
        3,
    )
    await store.purge(Retention(NOW + 50, result_ttl_s=10, row_ttl_s=1000))
    assert await records.get_line("t-answered") is None
    assert (await records.get_line("t-queued")) is not None
    assert await records.open_batches() == []


BATCH_BY = NOW + 3660.0  # a batch's hour and a sync call's minute from now
BODY: dict[str, object] = {"model": "m", "messages": []}


async def parked_on_line(store: Store) -> Task:
    """A claimed task with a 12 h deadline whose line waits to be packed, parked on it."""
    primary = await run_one(store, fingerprint="fp-line", deadline_s=12 * 3600.0)
    records = cast(TierRecords, store)
    assert await records.add_line(primary.id, "echo", "m", BODY, primary.deadline_at, NOW, BATCH_BY)
    assert await store.park(primary.id, "tok-1", f"line:{primary.id}", NOW + 3600, NOW)
    return primary


async def test_a_task_that_cannot_wait_for_a_batch_takes_the_work_off_its_queued_line(
    store: Store,
) -> None:
    records = cast(TierRecords, store)
    primary = await parked_on_line(store)
    patient = await submit(store, fingerprint="fp-line", deadline_s=6 * 3600.0, batch_by=BATCH_BY)
    line = await records.get_line(primary.id)
    assert patient.waits_for == primary.id and line is not None and line.state == "queued"
    urgent = await submit(
        store, fingerprint="fp-line", lane=Lane.INTERACTIVE, deadline_s=60.0, batch_by=BATCH_BY
    )
    work = await store.get(primary.id)
    line = await records.get_line(primary.id)
    assert urgent.waits_for == primary.id and line is not None and line.state == "withdrawn"
    assert work is not None
    # back to the queue now, on the sync tier, its attempt given back, in the interactive lane
    assert (work.status, work.tier, work.parked, work.lease_token, work.attempts) == (
        S.RETRYING, "sync", False, None, 0,
    )  # fmt: skip
    assert work.next_attempt_at == NOW
    ready = await store.ready(ReadyQuery(KINDS, NOW, 10))
    assert [(c.task_id, c.lane) for c in ready] == [(primary.id, Lane.INTERACTIVE)]
    # the parked poll's lease is gone: its late writes land nowhere
    assert not await store.park(primary.id, "tok-1", f"line:{primary.id}", NOW + 60, NOW)


@pytest.mark.parametrize(
    "joiner",
    [{"deadline_s": 120.0}, {"deadline_s": 6 * 3600.0, "tier": "flex"}],
    ids=["due-before-a-batch", "pinned-faster"],
)
async def test_a_task_due_sooner_or_pinned_faster_also_takes_the_work_off_its_line(
    store: Store, joiner: dict[str, Any]
) -> None:
    primary = await parked_on_line(store)
    await submit(store, fingerprint="fp-line", batch_by=BATCH_BY, **joiner)
    work = await store.get(primary.id)
    assert work is not None and (work.status, work.tier) == (S.RETRYING, "sync")


async def test_a_task_joining_work_whose_line_was_sent_waits_for_the_batch(store: Store) -> None:
    records = cast(TierRecords, store)
    primary = await parked_on_line(store)
    batch = await records.pack("echo", "m", 10, NOW)
    assert batch is not None
    urgent = await submit(
        store, fingerprint="fp-line", lane=Lane.INTERACTIVE, deadline_s=60.0, batch_by=BATCH_BY
    )
    work = await store.get(primary.id)
    line = await records.get_line(primary.id)
    assert urgent.waits_for == primary.id and line is not None and line.state == "sent"
    assert work is not None and (work.status, work.parked) == (S.RUNNING, True)


async def test_no_line_is_queued_for_work_a_waiting_task_cannot_wait_a_batch_for(
    store: Store,
) -> None:
    records = cast(TierRecords, store)
    primary = await submit(store, fingerprint="fp-line", deadline_s=12 * 3600.0)
    await submit(store, fingerprint="fp-line", lane=Lane.INTERACTIVE, batch_by=BATCH_BY)
    (claimed,) = await claim(store, ids=(primary.id,))
    refused = await records.add_line(
        claimed.id, "echo", "m", BODY, claimed.deadline_at, NOW, BATCH_BY
    )
    assert refused is None and await records.get_line(claimed.id) is None


async def test_recorded_names_the_provider_batch_ids_a_row_holds(store: Store) -> None:
    records = cast(TierRecords, store)
    await records.add_line("t-1", "chat", "m", {"model": "m", "messages": []}, None, NOW, NOW)
    batch = await records.pack("chat", "m", 1, NOW)
    assert batch is not None
    assert await records.recorded(["msgbatch_a", "msgbatch_b"]) == set()
    await records.sent(batch.id, "msgbatch_a", NOW)
    assert await records.recorded(["msgbatch_a", "msgbatch_b"]) == {"msgbatch_a"}
    assert await records.recorded([]) == set()
