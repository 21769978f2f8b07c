"""The batch tier end to end on OpenAI's Batch API (tests/integration/tier_rig.py: a fake
clock shared with the simulator, so batches held for hours finish in moments). Counts and
money are asserted, never timings."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from floodway import Status
from floodway.core.errors import RetryableError
from floodway.core.task import JSON
from floodway.core.tiers import UpstreamView
from floodway.providers.openai_batch import OpenAIBatchApi
from floodway.providers.sim import SimulatorConfig
from floodway.providers.sim.openai import create_openai_simulator_app
from floodway.providers.sim.openai.calls import OpenAISimulator
from floodway.store.base import SpendQuery
from floodway.testing import FakeClock
from tests.integration.tier_rig import HOUR, Rig, tier_rig

PRICE = {"input_per_1m": 0.15, "output_per_1m": 0.6}


@asynccontextmanager
async def rig(
    db_url: str,
    clock: FakeClock,
    *,
    hold_s: float,
    resources: dict[str, Any] | None = None,
    **kind: Any,
) -> AsyncIterator[Rig[OpenAISimulator]]:
    app = create_openai_simulator_app(
        SimulatorConfig(latency_ms=0, batch_hold_s=hold_s, rate_headers=False), clock.now
    )
    config = {
        "adapter": "openai",
        "endpoint": "chat",
        "model": "gpt-4o-mini",
        "base_url": "{url}/v1",
        "tiers": ["sync", "batch"],
        "price": PRICE,
        **kind,
    }
    async with tier_rig(app, db_url, clock, config, resources) as r:
        yield r


def chats(n: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"describe product {i}"}]} for i in range(n)]


def batch_cost(ledger: dict[str, Any]) -> float:
    """What the simulator billed its batch lines, at the kind's price and its batch discount."""
    batch = ledger["batch"]
    sync = (batch["input_tokens"] * PRICE["input_per_1m"]
            + batch["output_tokens"] * PRICE["output_per_1m"]) / 1e6  # fmt: skip
    return float(sync * batch["discount"])


async def test_a_thousand_tasks_with_a_12h_deadline_go_in_batches_at_half_the_sync_price(
    ledger_url: str, clock: FakeClock
) -> None:
    async with rig(ledger_url, clock, hold_s=HOUR, batch_max_lines=400, batch_max_age="1m") as r:
        tasks = await r.fw.submit_many("chat", chats(1000), deadline_s=12 * HOUR)
        await r.queued(1000)
        done = await r.run_until_done(tasks, step_s=300, steps=100)
        report = await r.fw.runtime.store.spend(SpendQuery(since=0.0))
        ledger = await r.ledger()
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 1000}
    assert all(t.tier == "batch" for t in done)
    assert [t.result["choices"][0]["message"]["content"] for t in done[:2]] == [
        "echo: describe product 0",
        "echo: describe product 1",
    ]
    # each task answered once, in 3 provider batches of at most 400 lines, none sent sync
    assert ledger["batch"] == {**ledger["batch"], "batches": 3, "lines": 1000}
    assert ledger["batch"]["double_charged"] == [] and ledger["total"] == 0
    spent = sum(line.cost for line in report.lines)
    saved = sum(line.tier_saved for line in report.lines)
    assert abs(spent - batch_cost(ledger)) < 1e-9  # the ledger and the provider's charges agree
    assert spent <= 0.51 * (spent + saved)  # against the same tasks on the sync tier
    print(f"1000 tasks: {ledger['batch']['batches']} upstream batches, "
          f"{ledger['batch']['lines']} lines, spent {spent:.6f}, saved {saved:.6f}")  # fmt: skip


async def test_interactive_tasks_of_the_kind_run_at_once_while_its_batch_is_pending(
    db_url: str, clock: FakeClock
) -> None:
    # Two provider slots: the 50 lines waiting in their batch hold none of them.
    llm = {"llm": {"concurrency": 2}}
    async with rig(db_url, clock, hold_s=HOUR, resources=llm, resource="llm") as r:
        background = await r.fw.submit_many("chat", chats(50), deadline_s=12 * HOUR)
        await r.queued(50)
        await r.step(60)  # the batch is sent
        assert [b.state for b in await r.fw.runtime.tier_records.open_batches()] == ["sent"]
        asks = [{"messages": [{"role": "user", "content": f"now {i}"}]} for i in range(5)]
        now = [await r.fw.submit("chat", a, lane="interactive", deadline_s=60) for a in asks]
        answered = [await r.fw.wait(t.id, timeout=30) for t in now]
        pending = await r.fw.runtime.store.ended([t.id for t in background])
    assert [(t.status, t.tier) for t in answered] == [(Status.SUCCEEDED, "sync")] * 5
    assert pending == set()  # the batch is still held upstream
    assert clock.now() - answered[0].created_at < 1  # no fake time had to pass for them


async def test_a_batch_that_would_miss_the_deadline_is_cancelled_and_the_rest_sent_sync(
    db_url: str, clock: FakeClock
) -> None:
    # Floodway expects the batch in 5 min; the provider holds it for 15; the deadline is 10.
    kind = {"turnaround": {"batch": "5m"}, "batch_max_age": "1m"}
    async with rig(db_url, clock, hold_s=15 * 60, **kind) as r:
        tasks = await r.fw.submit_many("chat", chats(20), deadline_s=600)
        await r.queued(20)
        done = await r.run_until_done(tasks, step_s=30, steps=200)
        report = await r.fw.runtime.store.spend(SpendQuery(since=0.0))
        ledger = await r.ledger()
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 20}
    assert all(t.finished_at is not None and t.deadline_at is not None
               and t.finished_at <= t.deadline_at for t in done)  # fmt: skip
    by_batch = int(ledger["batch"]["lines"])
    assert 0 < by_batch < 20  # cancelled partway: some lines answered
    # the lines the batch answered were never sent again; the others went sync, once each
    assert ledger["total"] == 20 - by_batch and ledger["double_charged"] == []
    assert Counter(t.tier for t in done) == {"batch": by_batch, "sync": 20 - by_batch}
    sync_ids = {t.id for t in done if t.tier == "sync"}
    assert len(ledger["batch"]["custom_ids"]) == by_batch
    assert set(ledger["batch"]["custom_ids"]) & sync_ids == set()
    sync_cost = sum(
        (t.result["usage"]["prompt_tokens"] * PRICE["input_per_1m"]
         + t.result["usage"]["completion_tokens"] * PRICE["output_per_1m"]) / 1e6
        for t in done if t.tier == "sync"
    )  # fmt: skip
    spent = sum(line.cost for line in report.lines)
    assert abs(spent - (batch_cost(ledger) + sync_cost)) < 1e-9


async def test_a_batch_created_upstream_but_not_recorded_is_found_by_its_tag_never_made_twice(
    db_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig(db_url, clock, hold_s=600, batch_max_age="1m") as r:
        api = r.fw.kinds.get("chat").tiers.batch
        assert isinstance(api, OpenAIBatchApi)
        create = api.create

        async def answer_lost(lines: list[JSON], tag: str) -> UpstreamView:
            await create(lines, tag)  # the provider made it; floodway never hears so
            raise RetryableError("POST /batches: ReadTimeout", type="connection")

        monkeypatch.setattr(api, "create", answer_lost)
        tasks = await r.fw.submit_many("chat", chats(10), deadline_s=12 * HOUR)
        await r.queued(10)
        await r.step(60)  # created, its answer lost, then found by its tag and recorded
        assert [b.state for b in await r.fw.runtime.tier_records.open_batches()] == ["sent"]
        assert len(r.sim.batches.created) == 1
        done = await r.run_until_done(tasks, step_s=60, steps=100)
        ledger = await r.ledger()
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 10}
    assert len(r.sim.batches.created) == 1  # found by its tag, not created again
    assert ledger["batch"]["lines"] == 10 and ledger["batch"]["double_charged"] == []


async def test_flex_calls_bill_at_the_batch_price_and_fall_back_to_sync_when_the_deadline_needs(
    db_url: str, clock: FakeClock
) -> None:
    kind = {"tiers": ["sync", "flex"], "turnaround": {"flex": "2m"}}
    async with rig(db_url, clock, hold_s=0, **kind) as r:
        slow = await r.fw.submit("chat", chats(1)[0], deadline_s=HOUR)
        flexed = await r.fw.wait(slow.id, timeout=30)
        r.sim.flex_available = False
        # 2 min of flex + 1 min of sync fit in an hour, not in 150 s: that one falls back
        waiting = await r.fw.submit("chat", chats(2)[1], deadline_s=HOUR)
        near = await r.fw.submit("chat", chats(3)[2], deadline_s=150)
        fell_back = await r.fw.wait(near.id, timeout=30)
        await r.step(1)
        retried = await r.fw.get(waiting.id)
        report = await r.fw.runtime.store.spend(SpendQuery(since=0.0))
    assert (flexed.status, flexed.tier) == (Status.SUCCEEDED, "flex")
    assert (fell_back.status, fell_back.tier) == (Status.SUCCEEDED, "sync")  # at its price
    assert retried.status in (Status.RETRYING, Status.RUNNING)  # flex again, later
    line = report.lines[0]
    usage = flexed.result["usage"]
    flex_cost = (usage["prompt_tokens"] * PRICE["input_per_1m"]
                 + usage["completion_tokens"] * PRICE["output_per_1m"]) / 1e6 * 0.5  # fmt: skip
    assert abs(line.tier_saved - flex_cost) < 1e-12  # only the flex call saved anything
    assert line.calls == 2


async def test_a_task_cancelled_while_its_line_waits_to_be_packed_is_never_sent(
    db_url: str, clock: FakeClock
) -> None:
    async with rig(db_url, clock, hold_s=60, batch_max_age="10m") as r:
        first, second = await r.fw.submit_many("chat", chats(2), deadline_s=12 * HOUR)
        await r.queued(2)
        for _ in range(6000):  # parked on its line (a minute at most)
            if (await r.fw.get(first.id)).parked:
                break
            await asyncio.sleep(0.01)
        await r.fw.cancel(first.id)
        await r.step(1)  # its poll, made due by the cancel, takes its line out
        done = await r.run_until_done([first, second], step_s=60, steps=100)
        ledger = await r.ledger()
    assert [t.status for t in done] == [Status.CANCELLED, Status.SUCCEEDED]
    assert ledger["batch"]["custom_ids"] == [second.id] and ledger["total"] == 0


async def test_the_batch_queue_limit_holds_and_the_rest_is_sent_as_room_frees(
    ledger_url: str, clock: FakeClock
) -> None:
    kind = {"batch_max_lines": 40, "batch_max_age": "1m", "batch_queue_limit": 100}
    async with rig(ledger_url, clock, hold_s=HOUR, **kind) as r:
        tasks = await r.fw.submit_many("chat", chats(250), deadline_s=12 * HOUR)
        await r.queued(250)
        await r.step(60)
        assert sum(b.lines for b in await r.fw.runtime.tier_records.open_batches()) == 100
        done = await r.run_until_done(tasks, step_s=300, steps=200)
        ledger = await r.ledger()
    assert Counter((t.status, t.tier) for t in done) == {(Status.SUCCEEDED, "batch"): 250}
    # never more than 100 lines enqueued at the provider, each line billed once
    assert ledger["batch"]["most_enqueued"] == 100
    assert ledger["batch"]["lines"] == 250 and ledger["batch"]["double_charged"] == []
    assert ledger["total"] == 0


async def test_a_task_that_ends_between_queuing_its_line_and_parking_never_has_it_sent(
    ledger_url: str, clock: FakeClock
) -> None:
    """The handler queued the line, then timed out before it parked on it (here: the ledger's
    answer held past the kind's 60 s timeout). Nobody would take that line's answer or record
    its bill: the batcher drops it unsent. A manual retry queues it again, billed once."""
    async with rig(ledger_url, clock, hold_s=HOUR, batch_max_age="1m") as r:
        records = r.fw.runtime.tier_records
        add_line, written, answer = records.add_line, asyncio.Event(), asyncio.Event()

        async def stalled(*args: Any, **kwargs: Any) -> Any:
            line = await add_line(*args, **kwargs)
            written.set()
            await answer.wait()
            return line

        records.add_line = stalled  # type: ignore[method-assign]
        [task] = await r.fw.submit_many("chat", chats(1), deadline_s=12 * HOUR)
        await asyncio.wait_for(written.wait(), 30)
        await r.step(61)  # past the handler's timeout
        await r.run_until_done([task], step_s=1, steps=10)
        assert (await r.fw.get(task.id)).status is Status.TIMEOUT
        answer.set()
        records.add_line = add_line  # type: ignore[method-assign]
        for _ in range(3):
            await r.step(60)  # the batcher's rounds
        assert await records.get_line(task.id) is None and await records.open_batches() == []
        assert (await r.ledger())["batch"]["lines"] == 0
        await r.fw.retry(task.id)
        await r.queued(1)
        [done] = await r.run_until_done([task], step_s=300, steps=100)
        ledger = await r.ledger()
    assert (done.status, done.tier) == (Status.SUCCEEDED, "batch")
    assert ledger["batch"]["lines"] == 1 and ledger["batch"]["double_charged"] == []
