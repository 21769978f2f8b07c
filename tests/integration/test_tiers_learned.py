"""What floodway measured of the batch tier outlives the process: a restarted one judges the
tier from the turnarounds the ledger kept, not from the configured estimate (the rig of
tests/integration/tier_rig.py, on SQLite and PostgreSQL)."""

from __future__ import annotations

from floodway import Status
from floodway.testing import FakeClock
from tests.integration.test_tiers_batch import chats, rig
from tests.integration.tier_rig import HOUR


async def test_a_restarted_process_judges_the_batch_tier_from_the_turnarounds_it_learned(
    ledger_url: str, clock: FakeClock
) -> None:
    # The provider takes 3 h for a batch; floodway's estimate, until it measured one, is 1 h.
    async with rig(ledger_url, clock, hold_s=3 * HOUR, batch_max_age="1m") as first:
        assert first.fw.kinds.get("chat").tiers.times.expected("batch") == HOUR
        tasks = await first.fw.submit_many("chat", chats(3), deadline_s=12 * HOUR)
        await first.queued(3)
        done = await first.run_until_done(tasks, step_s=600, steps=100)
        measured = first.fw.kinds.get("chat").tiers.times.expected("batch")
    assert [t.tier for t in done] == ["batch"] * 3
    assert 3 * HOUR <= measured < 3 * HOUR + 600  # its end seen within a step
    async with rig(ledger_url, clock, hold_s=3 * HOUR, batch_max_age="1m") as restarted:
        assert restarted.fw.kinds.get("chat").tiers.times.expected("batch") == measured
        # 2 h leave room for the estimate's batch, not for the learned one: sent sync
        task = await restarted.fw.submit("chat", chats(4)[3], deadline_s=2 * HOUR)
        (sent,) = await restarted.run_until_done([task], step_s=1, steps=100)
        ledger = await restarted.ledger()
    assert (sent.status, sent.tier) == (Status.SUCCEEDED, "sync")
    assert ledger["batch"]["batches"] == 0 and ledger["total"] == 1
