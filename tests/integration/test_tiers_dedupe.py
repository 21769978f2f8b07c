"""Dedupe across tiers, end to end on OpenAI's Batch API (the rig of
tests/integration/tier_rig.py: a fake clock shared with the simulator): a task that cannot wait
for a provider batch, joining work whose line waits to be packed, takes that work off the
batch tier and it runs at once on the sync tier, once, for both; joining a line already sent,
it waits for the batch and ends ``timeout`` at its deadline if the batch is late. What the
simulator billed is asserted, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from floodway import Status
from floodway.store.base import SpendQuery
from floodway.testing import FakeClock
from tests.integration.test_tiers_batch import chats, rig
from tests.integration.tier_rig import HOUR, Rig


async def parked_on_queued_line(r: Rig[object], task_id: str) -> None:
    """Until the task waits, parked, on its line (a minute at most, on a loaded machine)."""
    for _ in range(6000):
        line = await r.fw.runtime.tier_records.get_line(task_id)
        if line is not None and line.state == "queued" and (await r.fw.get(task_id)).parked:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{task_id} never parked on a queued line")


@pytest.mark.parametrize(
    ("lane", "deadline_s"),
    [("interactive", 60.0), ("background", 120.0)],  # 120 s: no room for a batch's hour
    ids=["interactive", "due-before-a-batch"],
)
async def test_a_task_that_cannot_wait_takes_queued_work_off_the_batch_tier_billed_once(
    ledger_url: str, clock: FakeClock, lane: str, deadline_s: float
) -> None:
    ask = chats(1)[0]
    async with rig(ledger_url, clock, hold_s=HOUR, batch_max_age="10m") as r:
        background = await r.fw.submit("chat", ask, deadline_s=12 * HOUR)
        await parked_on_queued_line(r, background.id)
        started = clock.now()
        urgent = await r.fw.submit("chat", ask, lane=lane, deadline_s=deadline_s)
        async with asyncio.timeout(60):  # a guard against a hang: no fake time passes
            answered = await r.fw.wait(urgent.id)
            work = await r.fw.wait(background.id)
        line = await r.fw.runtime.tier_records.get_line(background.id)
        report = await r.fw.runtime.store.spend(SpendQuery(since=0.0))
        ledger = await r.ledger()
    assert clock.now() == started  # it never waited for a batch
    assert (work.status, work.tier) == (Status.SUCCEEDED, "sync")
    assert answered.status is Status.DEDUPED and answered.result == work.result
    assert line is not None and line.state == "withdrawn"
    # one provider call for both, billed once; no provider batch was ever made
    assert (ledger["total"], ledger["double_charged"]) == (1, [])
    assert (ledger["batch"]["batches"], ledger["batch"]["lines"]) == (0, 0)
    assert [(x.calls, x.deduped) for x in report.lines] == [(1, 1)]


async def test_a_duplicate_of_a_sent_line_waits_for_its_batch_and_times_out_if_it_is_late(
    ledger_url: str, clock: FakeClock
) -> None:
    ask = chats(1)[0]
    async with rig(ledger_url, clock, hold_s=HOUR, batch_max_age="1m") as r:
        background = await r.fw.submit("chat", ask, deadline_s=12 * HOUR)
        await parked_on_queued_line(r, background.id)
        await r.step(60)  # packed and sent
        assert [b.state for b in await r.fw.runtime.tier_records.open_batches()] == ["sent"]
        urgent = await r.fw.submit("chat", ask, lane="interactive", deadline_s=60)
        (late,) = await r.run_until_done([urgent], step_s=30, steps=100)
        assert (await r.fw.get(background.id)).status is Status.RUNNING  # still in its batch
        (work,) = await r.run_until_done([background], step_s=300, steps=100)
        ledger = await r.ledger()
    assert late.status is Status.TIMEOUT
    assert late.finished_at is not None and late.deadline_at is not None
    assert late.finished_at - late.deadline_at <= 30  # at its deadline, within a step
    assert (work.status, work.tier) == (Status.SUCCEEDED, "batch")
    # the batch's one line, never a sync call for the same work
    assert ledger["total"] == 0
    assert (ledger["batch"]["batches"], ledger["batch"]["lines"]) == (1, 1)
    assert ledger["batch"]["double_charged"] == []
