"""The batch tier end to end on Anthropic's Message Batches API (``floodway simulate
--anthropic``'s, on the rig of tests/integration/tier_rig.py: a fake clock shared with the
simulator, so batches held for hours finish in moments). Counts and money are asserted,
never timings."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from floodway import Status
from floodway.core.errors import RetryableError
from floodway.core.task import JSON
from floodway.core.tiers import UpstreamView
from floodway.providers.anthropic_batch import AnthropicBatchApi
from floodway.providers.sim import SimulatorConfig
from floodway.providers.sim.anthropic import create_anthropic_simulator_app
from floodway.providers.sim.anthropic.calls import AnthropicSimulator
from floodway.store.base import SpendQuery
from floodway.testing import FakeClock
from tests.integration.tier_rig import HOUR, Rig, tier_rig

PRICE = {"input_per_1m": 3.0, "output_per_1m": 15.0}
KEY_ENV = "FW_TEST_ANTHROPIC_KEY"


@asynccontextmanager
async def rig(
    db_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, *, hold_s: float, **kind: Any
) -> AsyncIterator[Rig[AnthropicSimulator]]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    app = create_anthropic_simulator_app(
        SimulatorConfig(latency_ms=0, batch_hold_s=hold_s), clock.now
    )
    config = {
        "adapter": "anthropic",
        "model": "claude-sonnet-4-5",
        "max_output_tokens": 256,
        "api_key_env": KEY_ENV,
        "base_url": "{url}",
        "tiers": ["sync", "batch"],
        "price": PRICE,
        **kind,
    }
    async with tier_rig(app, db_url, clock, config) as r:
        yield r


def chats(n: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"describe product {i}"}]} for i in range(n)]


def cost(input_tokens: float, output_tokens: float) -> float:
    return (input_tokens * PRICE["input_per_1m"] + output_tokens * PRICE["output_per_1m"]) / 1e6


def batch_cost(ledger: dict[str, Any]) -> float:
    """What the simulator billed its batch lines, at the kind's price and its batch discount."""
    batch = ledger["batch"]
    return cost(batch["input_tokens"], batch["output_tokens"]) * float(batch["discount"])


async def test_a_thousand_tasks_with_a_12h_deadline_go_in_message_batches_at_half_price(
    ledger_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = {"batch_max_lines": 400, "batch_max_age": "1m"}
    async with rig(ledger_url, clock, monkeypatch, hold_s=HOUR, **kind) as r:
        tasks = await r.fw.submit_many("chat", chats(1000), deadline_s=12 * HOUR)
        await r.queued(1000)
        done = await r.run_until_done(tasks, step_s=300, steps=100)
        report = await r.fw.runtime.store.spend(SpendQuery(since=0.0))
        ledger = await r.ledger()
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 1000}
    assert all(t.tier == "batch" for t in done)
    assert [t.result["content"][0]["text"] for t in done[:2]] == [
        "echo: describe product 0",
        "echo: describe product 1",
    ]
    # each task answered once, in 3 provider batches of at most 400 requests, none sent sync
    assert ledger["batch"] == {**ledger["batch"], "batches": 3, "lines": 1000}
    assert ledger["batch"]["double_charged"] == [] and ledger["sync"]["calls"] == 0
    spent = sum(line.cost for line in report.lines)
    saved = sum(line.tier_saved for line in report.lines)
    assert abs(spent - batch_cost(ledger)) < 1e-9  # the ledger and the provider's charges agree
    assert spent <= 0.51 * (spent + saved)  # against the same tasks on the sync tier
    print(f"1000 tasks: {ledger['batch']['batches']} upstream batches, "
          f"{ledger['batch']['lines']} lines, spent {spent:.6f}, sync price "
          f"{spent + saved:.6f}, ratio {spent / (spent + saved):.4f}")  # fmt: skip


async def test_a_batch_that_would_miss_the_deadline_is_cancelled_and_the_rest_sent_sync(
    db_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Floodway expects the batch in 5 min; the provider holds it for 15; the deadline is 10.
    kind = {"turnaround": {"batch": "5m"}, "batch_max_age": "1m"}
    async with rig(db_url, clock, monkeypatch, hold_s=15 * 60, **kind) as r:
        tasks = await r.fw.submit_many("chat", chats(20), deadline_s=600)
        await r.queued(20)
        done = await r.run_until_done(tasks, step_s=30, steps=200)
        report = await r.fw.runtime.store.spend(SpendQuery(since=0.0))
        ledger = await r.ledger()
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 20}
    assert all(t.finished_at is not None and t.deadline_at is not None
               and t.finished_at <= t.deadline_at for t in done)  # fmt: skip
    by_batch = int(ledger["batch"]["lines"])
    assert 0 < by_batch < 20  # cancelled partway: some requests answered
    # the requests the batch answered were never sent again; the others went sync, once each
    assert ledger["sync"]["calls"] == 20 - by_batch and ledger["batch"]["double_charged"] == []
    assert Counter(t.tier for t in done) == {"batch": by_batch, "sync": 20 - by_batch}
    sync_ids = {t.id for t in done if t.tier == "sync"}
    assert set(ledger["batch"]["custom_ids"]) & sync_ids == set()
    assert len(ledger["batch"]["custom_ids"]) == by_batch
    sync_cost = cost(ledger["sync"]["input_tokens"], ledger["sync"]["output_tokens"])
    spent = sum(line.cost for line in report.lines)
    assert abs(spent - (batch_cost(ledger) + sync_cost)) < 1e-9


async def test_a_batch_created_upstream_but_not_recorded_is_found_never_made_twice(
    db_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig(db_url, clock, monkeypatch, hold_s=600, batch_max_age="1m") as r:
        api = r.fw.kinds.get("chat").tiers.batch
        assert isinstance(api, AnthropicBatchApi)
        create = api.create

        async def answer_lost(lines: list[JSON], tag: str) -> UpstreamView:
            await create(lines, tag)  # the provider made it; floodway never hears so
            raise RetryableError("POST /v1/messages/batches: ReadTimeout", type="connection")

        monkeypatch.setattr(api, "create", answer_lost)
        tasks = await r.fw.submit_many("chat", chats(10), deadline_s=12 * HOUR)
        await r.queued(10)
        await r.step(60)  # created, its answer lost, then found in the list and recorded
        assert [b.state for b in await r.fw.runtime.tier_records.open_batches()] == ["sent"]
        assert len(r.sim.batches.created) == 1
        done = await r.run_until_done(tasks, step_s=60, steps=100)
        ledger = await r.ledger()
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 10}
    assert len(r.sim.batches.created) == 1  # found, not created again
    assert ledger["batch"]["lines"] == 10 and ledger["batch"]["double_charged"] == []


async def test_while_a_row_waits_to_be_mended_no_other_batch_is_made_and_each_is_made_once(
    db_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two full batches of 5 are due. The first create never reaches Anthropic, so its row
    # waits to be mended and the second is not packed; the mend's create makes it, but its
    # answer is lost; the next round finds it (the only unrecorded batch of its size) and
    # only then is the second batch made.
    kind = {"batch_max_lines": 5, "batch_max_age": "1m"}
    async with rig(db_url, clock, monkeypatch, hold_s=600, **kind) as r:
        api = r.fw.kinds.get("chat").tiers.batch
        assert isinstance(api, AnthropicBatchApi)
        create = api.create
        calls: list[str] = []

        async def flaky(lines: list[JSON], tag: str) -> UpstreamView:
            calls.append(tag)
            if len(calls) == 1:
                raise RetryableError("POST /v1/messages/batches: ConnectError", type="connection")
            view = await create(lines, tag)
            if len(calls) == 2:
                raise RetryableError("POST /v1/messages/batches: ReadTimeout", type="connection")
            return view

        monkeypatch.setattr(api, "create", flaky)
        tasks = await r.fw.submit_many("chat", chats(10), deadline_s=12 * HOUR)
        await r.queued(10)
        await r.step(60)  # packed, not created; mended: created, its answer lost
        open_ = await r.fw.runtime.tier_records.open_batches()
        assert [b.state for b in open_] == ["creating"] and len(r.sim.batches.created) == 1
        await r.step(1)  # found and recorded
        assert [b.state for b in await r.fw.runtime.tier_records.open_batches()] == ["sent"]
        await r.step(1)  # the second batch packed and made
        open_ = await r.fw.runtime.tier_records.open_batches()
        assert [b.state for b in open_] == ["sent", "sent"] and len(r.sim.batches.created) == 2
        done = await r.run_until_done(tasks, step_s=60, steps=100)
        ledger = await r.ledger()
    assert Counter(t.status for t in done) == {Status.SUCCEEDED: 10}
    assert {t.tier for t in done} == {"batch"} and len(calls) == 3
    assert len(r.sim.batches.created) == 2  # the lost one taken, never made twice
    assert ledger["batch"]["lines"] == 10 and ledger["batch"]["double_charged"] == []
    assert ledger["sync"]["calls"] == 0


async def test_the_batch_queue_limit_holds_on_message_batches(
    db_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = {"batch_max_lines": 40, "batch_max_age": "1m", "batch_queue_limit": 100}
    async with rig(db_url, clock, monkeypatch, hold_s=HOUR, **kind) as r:
        tasks = await r.fw.submit_many("chat", chats(250), deadline_s=12 * HOUR)
        await r.queued(250)
        done = await r.run_until_done(tasks, step_s=300, steps=200)
        ledger = await r.ledger()
    assert Counter((t.status, t.tier) for t in done) == {(Status.SUCCEEDED, "batch"): 250}
    assert ledger["batch"]["most_enqueued"] == 100
    assert ledger["batch"]["lines"] == 250 and ledger["batch"]["double_charged"] == []
