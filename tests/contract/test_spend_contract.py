"""The spend ledger and budgets, on every backend: a billed call's charge is written with its
completion, a deduped task records what it saved, and a budget is checked atomically with the
submit that would pass it (two stores on one ledger stand for two API processes)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from floodway.core.errors import BudgetExceeded
from floodway.core.outcome import Completion
from floodway.core.spend import Budget, Charge, Usage
from floodway.core.states import Status
from floodway.core.task import NewTask, Task
from floodway.store.base import ClaimParams, Retention, SpendQuery, Store

from .conftest import Backend

NOW = 1_700_000_000.0
DAY = 86400.0
S = Status


def task(n: int = 1, **kw: Any) -> NewTask:
    kw.setdefault("input", {"n": n})
    return NewTask(kind="echo", **kw)


async def running(store: Store, t: Task, token: str = "tok") -> Task:
    (got,) = await store.claim(ClaimParams("w1", token, ("echo",), 1, NOW, 30.0, (t.id,)))
    return got


def charge(cost: float, tokens: float = 100.0) -> Charge:
    return Charge(Usage(input_tokens=tokens, output_tokens=tokens / 2), cost)


async def test_a_charge_is_written_with_its_completion(store: Store) -> None:
    t = (await store.submit([task(tenant="acme")], NOW))[0].task
    r = await running(store, t)
    item = Completion(
        t.id, S.RETRYING, lease_token=r.lease_token, next_attempt_at=NOW + 1, charge=charge(0.25)
    )
    assert (await store.complete([item], NOW + 1))[0].applied
    r = await running(store, t, "tok-2")
    done = Completion(
        t.id, S.SUCCEEDED, lease_token=r.lease_token, result={"ok": 1}, charge=charge(0.5)
    )
    assert (await store.complete([done], NOW + 2))[0].applied
    report = await store.spend(SpendQuery(since=0.0, bucket_s=DAY))
    (line,) = report.lines
    assert (line.tenant, line.kind, line.calls, line.deduped) == ("acme", "echo", 2, 0)
    assert line.cost == pytest.approx(0.75)
    assert (line.input_tokens, line.output_tokens, line.saved) == (200.0, 100.0, 0.0)
    assert [(p.at, p.cost) for p in report.series] == [(NOW // DAY * DAY, pytest.approx(0.75))]


async def test_a_write_that_does_not_land_spends_nothing(store: Store) -> None:
    t = (await store.submit([task()], NOW))[0].task
    await running(store, t)
    stale = Completion(t.id, S.SUCCEEDED, lease_token="someone-else", charge=charge(1.0))
    assert not (await store.complete([stale], NOW + 1))[0].applied
    assert (await store.spend(SpendQuery(since=0.0))).lines == ()


@pytest.mark.parametrize("batched", [False, True])
async def test_deduped_tasks_record_what_they_saved(store: Store, batched: bool) -> None:
    fp = "fp-1"
    primary = (await store.submit([task(fingerprint=fp)], NOW))[0].task
    waiter = (await store.submit([task(fingerprint=fp, spend_hold=0.4)], NOW))[0].task
    assert waiter.waits_for == primary.id
    r = await running(store, primary)
    done = Completion(
        primary.id, S.SUCCEEDED, lease_token=r.lease_token, result={"x": 1}, charge=charge(0.4)
    )
    items = [done]
    if batched:  # the many-row write path
        other = (await store.submit([task(n=2)], NOW))[0].task
        o = await running(store, other, "tok-o")
        items.append(Completion(other.id, S.SUCCEEDED, lease_token=o.lease_token))
    await store.complete(items, NOW + 1)
    late = (await store.submit([task(fingerprint=fp, spend_hold=0.4)], NOW + 2))[0].task
    assert late.status is S.DEDUPED
    # Neither the waiter nor the late one will ever bill: each holds nothing.
    held = [await store.get(t.id) for t in (waiter, late)]
    assert [t.spend_hold if t else None for t in held] == [0.0, 0.0]
    (line,) = (await store.spend(SpendQuery(since=0.0))).lines
    assert (line.calls, line.deduped) == (1, 2)
    assert line.cost == pytest.approx(0.4)
    assert line.saved == pytest.approx(0.8)


async def test_a_deduped_task_is_never_a_call_priced_or_not(store: Store) -> None:
    """A free kind's call saves nothing to the tasks that took its result: each is still a
    deduped task, never a call (the totals counted every row with saved 0 as one)."""
    fp = "fp-free"
    primary = (await store.submit([task(fingerprint=fp)], NOW))[0].task
    waiters = [(await store.submit([task(fingerprint=fp)], NOW))[0].task for _ in range(3)]
    r = await running(store, primary)
    done = Completion(
        primary.id, S.SUCCEEDED, lease_token=r.lease_token, result={"x": 1}, charge=charge(0.0)
    )
    await store.complete([done], NOW + 1)
    late = (await store.submit([task(fingerprint=fp)], NOW + 2))[0].task
    assert late.status is S.DEDUPED and all(w.waits_for == primary.id for w in waiters)
    (line,) = (await store.spend(SpendQuery(since=0.0))).lines
    assert (line.calls, line.deduped, line.cost, line.saved) == (1, 4, 0.0, 0.0)


async def test_what_a_call_bills_above_its_hold_is_recorded(store: Store) -> None:
    held = [(await store.submit([task(n=i, spend_hold=0.2)], NOW))[0].task for i in range(2)]
    for t, cost in zip(held, (0.5, 0.1), strict=True):
        r = await running(store, t, f"tok-{t.id}")
        done = Completion(t.id, S.SUCCEEDED, lease_token=r.lease_token, charge=charge(cost))
        await store.complete([done], NOW + 1)
    (line,) = (await store.spend(SpendQuery(since=0.0))).lines
    assert line.over_estimate == pytest.approx(0.3)
    over = [(await store.get(t.id)) for t in held]
    assert [t.over_estimate for t in over if t is not None] == [pytest.approx(0.3), 0.0]


async def test_spend_is_filtered_by_tenant_kind_and_time(store: Store) -> None:
    for tenant, when in (("a", NOW), ("b", NOW), ("a", NOW + 2 * DAY)):
        t = (await store.submit([task(tenant=tenant, input={"w": when})], when))[0].task
        r = await running(store, t)
        done = Completion(t.id, S.SUCCEEDED, lease_token=r.lease_token, charge=charge(1.0))
        await store.complete([done], when)
    assert len((await store.spend(SpendQuery(since=0.0))).lines) == 2
    (a,) = (await store.spend(SpendQuery(since=0.0, tenant="a"))).lines
    assert a.cost == 2.0
    (recent,) = (await store.spend(SpendQuery(since=NOW + DAY))).lines
    assert (recent.tenant, recent.cost) == ("a", 1.0)
    assert (await store.spend(SpendQuery(since=0.0, kind="other"))).lines == ()
    purged = Retention(NOW + 2 * DAY, result_ttl_s=DAY, row_ttl_s=DAY)
    await store.purge(purged)
    assert [line.cost for line in (await store.spend(SpendQuery(since=0.0))).lines] == [1.0]


async def test_a_budget_refuses_the_submit_that_would_pass_it_and_writes_nothing(
    store: Store,
) -> None:
    budget = Budget(amount=1.0, period_s=DAY)
    first = await store.submit([task(n=i, spend_hold=0.3, budget=budget) for i in range(3)], NOW)
    assert len(first) == 3
    with pytest.raises(BudgetExceeded) as refused:
        await store.submit([task(n=9, spend_hold=0.3, budget=budget)], NOW)
    assert refused.value.left == pytest.approx(0.1)
    assert refused.value.resets_at == NOW // DAY * DAY + DAY
    assert sum((await store.stats()).by_status.values()) == 3
    # A task that ends without a call frees its hold; the charge of one that ran is spent.
    r = await running(store, first[0].task)
    done = Completion(r.id, S.SUCCEEDED, lease_token=r.lease_token, charge=charge(0.05))
    await store.complete([done], NOW + 1)
    use = await store.budget_use("default", budget.period_start(NOW))
    assert (use.spent, use.held) == (pytest.approx(0.05), pytest.approx(0.6))
    await store.submit([task(n=10, spend_hold=0.3, budget=budget)], NOW + 1)
    # The next period starts from nothing spent (what is still in flight stays held).
    await store.submit([task(n=11, spend_hold=0.05, budget=budget)], NOW + DAY)


async def test_a_budget_holds_under_concurrent_submitters(backend: Backend) -> None:
    budget = Budget(amount=10.0, period_s=DAY)
    async with backend.opened() as a, backend.opened() as b:
        results = await asyncio.gather(
            *[
                s.submit([task(n=i, spend_hold=0.7, budget=budget)], NOW)
                for i, s in enumerate([a, b] * 25)
            ],
            return_exceptions=True,
        )
        accepted = [r for r in results if isinstance(r, list)]
        refused = [r for r in results if isinstance(r, BudgetExceeded)]
        assert (len(accepted), len(refused)) == (14, 36), results
        use = await a.budget_use("default", NOW // DAY * DAY)
        assert use.held == pytest.approx(14 * 0.7)


async def test_a_manual_retry_holds_its_estimate_again_within_the_budget(store: Store) -> None:
    budget = Budget(amount=1.0, period_s=DAY)
    (first,) = await store.submit([task(n=1, spend_hold=0.6, budget=budget)], NOW)
    r = await running(store, first.task)
    dead = Completion(r.id, S.DEAD, lease_token=r.lease_token)
    assert (await store.complete([dead], NOW + 1))[0].applied
    await store.submit([task(n=2, spend_hold=0.6, budget=budget)], NOW + 1)  # its room now
    with pytest.raises(BudgetExceeded):
        await store.manual_retry(first.task.id, None, NOW + 2, budget)
    still = await store.get(first.task.id)
    assert still is not None and still.status is S.DEAD  # nothing written
    retried = await store.manual_retry(first.task.id, None, NOW + DAY, Budget(2.0, DAY))
    assert retried.status is S.QUEUED
