"""The handler of a kind with provider tiers (core/tiers.py): each attempt's call goes on the
tier :meth:`~floodway.kinds.TierPlan.choose` picks.

- **sync**: the adapter's call.
- **flex** (OpenAI's): the same call with ``service_tier = "flex"``, billed at the batch
  price. A 429 of flex's (the provider has no capacity now) is sent again at once on the sync
  tier when the deadline leaves no room to wait for flex; otherwise it is retried like any
  429.
- **batch**: the request becomes the task's line in the ledger (``ctx.lines``) and the task is
  parked on it, without a provider slot. The batcher (floodway/maintenance/tier_batches.py)
  packs lines into provider batches, polls them and records each line's answer; the task's
  poll (:class:`LinePoller`) reads its line from the ledger and ends the task on it. A line
  taken out of its batch before the deadline sends the task on a faster tier; a line the
  provider answered is never sent again: the task takes its result. No line is queued for
  work that a task waiting for it cannot wait a batch for (interactive, or due sooner): that
  work goes on the sync tier (and a task joining work whose line is queued takes it off the
  batch tier itself: store/rules.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from floodway.context import Context
from floodway.core.errors import FatalError, RetryableError
from floodway.core.outcome import Parked
from floodway.core.task import JSON
from floodway.core.tiers import BatchLine, Tier
from floodway.core.upstream import JobView, PollSchedule
from floodway.kinds import TierPlan
from floodway.providers.base import Adapter, Finished

#: a parked line's task is polled at least this often (its batch's end wakes it sooner)
LINE_POLL_MAX_GAP_S = 600.0


def line_ref(task_id: str) -> str:
    """The upstream ref of a task parked on its batch line."""
    return f"line:{task_id}"


def take_line(ctx: Context, line: BatchLine) -> JSON:
    """A line the provider answered: its result, its usage billed at the batch price."""
    ctx.report_usage(
        line.input_tokens + line.output_tokens,
        input_tokens=line.input_tokens,
        output_tokens=line.output_tokens,
        tier="batch",
    )
    return line.result


class TierAdapter(Adapter, Protocol):
    """An adapter whose calls may go on a provider's tiers: its request body is what a batch
    line holds (the openai and anthropic adapters)."""

    def request_body(self, value: JSON) -> dict[str, Any]: ...


@dataclass
class TieredHandler:
    adapter: TierAdapter
    plan: TierPlan

    async def __call__(self, ctx: Context, value: JSON) -> JSON | Parked:
        line = None if ctx.lines is None else await ctx.lines.get()
        without: tuple[Tier, ...] = ()
        if line is not None:
            if line.state in ("queued", "sent"):  # resumed after a crash: still in its batch
                return self._park(ctx)
            if line.state == "done":  # answered: never sent again
                return take_line(ctx, line)
            if line.state == "failed" and line.fatal:
                raise FatalError(line.error or "the batch line failed", type=line.error_type)
            if line.state == "withdrawn":  # taken out to meet the deadline: a faster tier
                without = ("batch",)
        tier = self.plan.choose(ctx.task, ctx.now(), without=without)
        if ctx.lines is not None and tier != ctx.task.tier:
            await ctx.lines.set_tier(tier)
        if tier == "batch":
            if await self._queue(ctx, value, line):
                return self._park(ctx)
            # A task waiting for the same work cannot wait for a batch: it runs now.
            tier = "sync"
            assert ctx.lines is not None
            await ctx.lines.set_tier(tier)
        started = ctx.now()
        result = await (self._flex(ctx, value) if tier == "flex" else self._call(ctx, value))
        self.plan.times.observe(tier, ctx.now() - started)
        return result

    async def _queue(self, ctx: Context, value: JSON, line: BatchLine | None) -> bool:
        """The task's line queued for the next batch; False when the work is needed sooner
        (:meth:`~floodway.context.LineBook.add`)."""
        assert ctx.lines is not None  # a kind with the batch tier has a line book
        batch_by = self.plan.batch_by(ctx.now())
        if line is not None:
            return await ctx.lines.requeue(batch_by)
        body = self.adapter.request_body(value)
        return await ctx.lines.add(str(body.get("model", "")), body, batch_by) is not None

    def _park(self, ctx: Context) -> Parked:
        poll_at = ctx.now() + self.plan.max_age_s + self.plan.times.expected("batch")
        if ctx.task.deadline_at is not None:
            poll_at = min(poll_at, ctx.task.deadline_at)
        return Parked(line_ref(ctx.task_id), poll_at, holds_slot=False)

    async def _call(self, ctx: Context, value: JSON) -> JSON:
        answer = await self.adapter.submit(ctx, value)
        assert isinstance(answer, Finished)  # a tiered provider's calls answer at once
        return answer.result

    async def _flex(self, ctx: Context, value: JSON) -> JSON:
        body = {**self.adapter.request_body(value), "service_tier": "flex"}
        try:
            result = await self._call(ctx, body)
        except RetryableError as exc:
            if exc.status != 429 or not self._no_time_for_flex(ctx):
                raise
            if ctx.lines is not None:
                await ctx.lines.set_tier("sync")
            return await self._call(ctx, value)
        if ctx.billed is not None:
            ctx.billed = dataclasses.replace(ctx.billed, tier="flex")
        return result

    def _no_time_for_flex(self, ctx: Context) -> bool:
        deadline = ctx.task.deadline_at
        if deadline is None:
            return False
        times = self.plan.times
        # Refused for capacity: the flex calls measured so far say nothing of the wait for it,
        # so the configured estimate counts if it is the longer.
        flex = max(times.expected("flex"), times.estimates["flex"])
        return ctx.now() + flex + times.expected("sync") > deadline

    async def aclose(self) -> None:
        await self.adapter.aclose()


@dataclass(frozen=True)
class LinePoller:
    """The :class:`~floodway.kinds.JobPoller` of a kind with the batch tier: a task parked
    on its line looks at the line in the ledger (the batcher polls the provider)."""

    schedule: PollSchedule

    async def poll(self, ctx: Context, ref: str) -> tuple[str, JSON]:
        line = None if ctx.lines is None else await ctx.lines.get()
        if line is None:
            return "failed", "the task has no batch line"
        if line.state == "done":
            return "done", take_line(ctx, line)
        if line.state == "failed":
            if line.fatal:
                raise FatalError(line.error or "the batch line failed", type=line.error_type)
            return "failed", line.error or "the batch line failed"
        if line.state == "withdrawn":
            return "failed", "taken out of its provider batch to meet the task's deadline"
        return "running", None

    async def cancel(self, ctx: Context, ref: str) -> bool:
        """A line not sent yet is taken out; one in a sent batch stays (a provider batch
        cannot drop one of its lines) and may still be answered."""
        line = None if ctx.lines is None else await ctx.lines.get()
        if ctx.lines is None or line is None or line.state != "queued":
            return False
        await ctx.lines.withdraw()
        return True

    def read_callback(self, body: JSON) -> tuple[str | None, JobView]:
        return None, JobView("running")  # no provider calls back about a batch line

    @property
    def holds_slots(self) -> bool:
        return False


def line_schedule(plan: TierPlan) -> PollSchedule:
    return PollSchedule(first_s=plan.max_age_s, max_gap_s=LINE_POLL_MAX_GAP_S)
