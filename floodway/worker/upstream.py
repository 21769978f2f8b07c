"""The upstream poller: wakes tasks parked on an async upstream job and polls them.

A task whose handler submitted an upstream job is *parked* (``Store.park``): still ``running``,
no lease, no worker slot, its provider concurrency slot kept, ``next_attempt_at`` = its next
poll. This loop, started by every :class:`~floodway.worker.worker.Worker`, sleeps until the
earliest poll it knows of (its own parks, ``Store.next_parked_at``) or a wake-up, on the
engine's clock; then it claims the due tasks (``Store.claim_parked`` gives each a lease), polls
each upstream job once through the kind's ``poll`` and writes what it learned:

- done -> ``succeeded`` (or invalid output -> the retry policy's poison count, as for results
  returned by handlers), usage settled;
- failed -> the retry policy decides (retrying -> the handler looks at the job again and
  resubmits; fatal -> failed);
- running -> parked again for the next poll of the kind's schedule, unless the poll budget
  (``poll_max_attempts``) or the task's deadline is spent -> ``timeout`` (upstream cancelled);
- the poll request itself failed (network, 5xx, 429) -> parked again: the job may be fine.

Every write is a compare-and-set with the lease from ``claim_parked``; a webhook completes a
parked task with ``Completion(parked=True)``. Whichever lands first wins, the other changes
nothing (and settles nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
from collections.abc import Mapping

from floodway.clock import wait_event
from floodway.context import Context
from floodway.core import changes
from floodway.core.outcome import Completion, Failed, Outcome
from floodway.core.retry import RetryPolicy
from floodway.core.states import Status
from floodway.core.task import JSON, ErrorClass, ErrorInfo, Task, new_token
from floodway.kinds import KindSpec
from floodway.limits.base import Permit, Settlement
from floodway.runtime import Runtime
from floodway.store.base import ClaimParams
from floodway.worker.executor import checked_result

log = logging.getLogger("floodway.upstream")


def job_outcome(
    spec: KindSpec, policy: RetryPolicy, state: str, value: JSON, usage: float | None
) -> Outcome:
    """What a finished or failed upstream job means for its task. The output schema is checked
    here because a polled result never passes through the executor."""
    if state == "done":
        return checked_result(spec, policy, value, usage)
    if state == "failed":
        message = str(value) if value is not None else "the upstream job failed"
        return Failed(ErrorInfo(ErrorClass.RETRYABLE, "upstream_failed", message), usage=usage)
    error = ErrorInfo(ErrorClass.FATAL, "bad_poll", f"poll answered an unknown state {state!r}")
    return Failed(error, usage=usage)


async def finish_upstream(
    runtime: Runtime,
    task: Task,
    item: Completion,
    *,
    usage: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> bool:
    """Write ``item`` for a task waiting on an upstream job; True if this write landed. Only
    the write that lands, or that closes the attempt of a task a cancel ended meanwhile,
    releases the provider slot: the loser of a webhook/poll race must not settle the same
    permit twice. A task given up on while its job may still run (``item.orphan_until``) keeps
    the job's slot until then."""
    now = runtime.clock.now()
    applied = (await runtime.store.complete([item], now))[0]
    if not (applied.applied or applied.closed):
        return False
    held = None
    if item.orphan_until is not None:
        held = runtime.kinds.get(task.kind).slot_held_until(task, item.orphan_until, now) - now
    settlement = Settlement(actual_cost=usage, headers=dict(headers or {}), still_running_s=held)
    await runtime.admission.settle(permit_of(runtime, task), settlement, runtime.clock.now())
    return applied.applied


def permit_of(runtime: Runtime, task: Task) -> Permit:
    """The permit a parked task holds, rebuilt from its row."""
    return runtime.admission.permit_for(task.id, task.kind, task.tenant, task.cost_estimated)


class UpstreamPoller:
    def __init__(
        self,
        runtime: Runtime,
        *,
        owner: str,
        lease_s: float,
        # Polls are short: a few at a time keep up, and fewer in flight cost less CPU each.
        concurrency: int = 16,
        idle_s: float = 1.0,
        batch_s: float = 0.01,
        rng: random.Random | None = None,
    ) -> None:
        self.runtime = runtime
        self.owner = owner
        self.lease_s = lease_s
        self.concurrency = concurrency
        # Parks by other processes are found at least this often (they cannot wake us).
        self.idle_s = idle_s
        self._rng = rng or random.Random()
        self.batch_s = batch_s
        self._wake = asyncio.Event()
        self._due: list[float] = []  # poll times of parks made in this process
        self._sleeping_until = float("-inf")  # when the loop wakes anyway (-inf: awake)
        self._waiting_for_slot = False
        self._store_checked_at = float("-inf")
        self._store_next: float | None = None
        self._polls: set[asyncio.Task[None]] = set()
        self.polls = 0  # upstream polls made (for stats and tests)

    def wake(self, at: float | None = None) -> None:
        """A task was parked for a poll at ``at``: wake the loop if that is sooner than the
        loop planned to wake anyway (so re-parks after each poll cost no extra round)."""
        if at is None:
            self._wake.set()
            return
        heapq.heappush(self._due, at)
        if at < self._sleeping_until:
            self._wake.set()

    async def run(self) -> None:
        kinds = tuple(s.name for s in self.runtime.kinds.specs() if s.poll is not None)
        if not kinds:
            return
        clock = self.runtime.clock
        try:
            while True:
                self._wake.clear()  # before claiming: a park made meanwhile re-sets it
                if await self._claim_due(kinds):
                    continue  # every free slot was filled: there may be more due
                timeout = await self._sleep_for()
                # From here to the wait nothing awaits, so a wake() cannot slip in between.
                self._sleeping_until = clock.now() + timeout
                await wait_event(clock, self._wake, timeout)
                self._sleeping_until = float("-inf")
        finally:
            await self._stop_polls()

    async def _claim_due(self, kinds: tuple[str, ...]) -> bool:
        free = self.concurrency - len(self._polls)
        if free <= 0:
            return False
        runtime = self.runtime
        # Polls due within the batch window are taken now, in one claim, rather than each
        # with its own wake-up and claim a few milliseconds apart.
        now = runtime.clock.now()
        upto = now + self.batch_s
        if not self._maybe_due(now, upto):
            return False  # a wake-up for a later poll: no claim needed (it is a write)
        while self._due and self._due[0] <= upto:
            heapq.heappop(self._due)
        params = ClaimParams(self.owner, new_token(), kinds, free, upto, self.lease_s)
        try:
            tasks = await runtime.store.claim_parked(params)
        except Exception:
            log.exception("claiming parked tasks failed; trying again shortly")
            await runtime.clock.sleep(1.0)
            return False
        for task in tasks:
            job = asyncio.create_task(self._poll_one(task), name=f"floodway-poll-{task.id}")
            self._polls.add(job)
            job.add_done_callback(self._poll_done)
        return len(tasks) == free

    def _maybe_due(self, now: float, upto: float) -> bool:
        if self._due and self._due[0] <= upto:
            return True  # one of our own parks
        if self._store_next is not None and self._store_next <= upto:
            return True  # one the store told us about
        # Otherwise only the periodic look for parks made by other processes.
        return now >= self._store_checked_at + self.idle_s

    def _poll_done(self, job: asyncio.Task[None]) -> None:
        self._polls.discard(job)
        if not job.cancelled() and job.exception() is not None:
            log.error("upstream poll crashed", exc_info=job.exception())
        if self._waiting_for_slot:
            self._wake.set()

    async def _sleep_for(self) -> float:
        """Seconds until the next poll we know of (at most ``idle_s``)."""
        runtime = self.runtime
        self._waiting_for_slot = len(self._polls) >= self.concurrency
        if self._waiting_for_slot:
            return self.idle_s  # woken when a poll finishes
        now = runtime.clock.now()
        if now >= self._store_checked_at + self.idle_s:
            # Parks made by other processes (or left by dead ones) are not in our heap; the
            # store knows them. Asked at most once per idle period: our own parks are cheaper.
            self._store_checked_at = now
            try:
                self._store_next = await runtime.store.next_parked_at()
            except Exception:
                log.exception("reading the next parked poll failed")
                self._store_next = None
            now = runtime.clock.now()
        timeout = self.idle_s
        if self._due:
            timeout = min(timeout, self._due[0] - now)
        # One already due but not claimed is not ours (another kind, another poller's claim):
        # it must not make us spin.
        if self._store_next is not None and self._store_next > now:
            timeout = min(timeout, self._store_next - now)
        return max(0.001, timeout)

    async def _stop_polls(self) -> None:
        polls = list(self._polls)
        for job in polls:
            job.cancel()
        if polls:
            await asyncio.wait(polls)

    # -- one poll -------------------------------------------------------------------------------
    async def _poll_one(self, task: Task) -> None:
        runtime = self.runtime
        try:
            await self._poll(task)
        except asyncio.CancelledError:
            # The worker is stopping: park the task again, due at once, for whoever runs next.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._park_again(task, runtime.clock.now(), polled=False))
            raise

    async def _poll(self, task: Task) -> None:
        runtime = self.runtime
        spec = runtime.kinds.get(task.kind)
        ctx = runtime.context(task)
        ref = task.upstream_ref
        if ref is None or spec.poll is None:  # not ours to poll: let the handler look again
            await self._hand_back(task, "parked without an upstream job to poll")
            return
        if task.cancel_requested:
            stopped = await self._cancel_upstream(spec, ctx, ref)
            error = ErrorInfo(ErrorClass.CANCELLED, "cancelled", "cancelled while waiting upstream")
            item = self._give_up_on(task, spec, stopped, Status.CANCELLED, error)
            await finish_upstream(runtime, task, item)
            return
        # "Still running" is news as of when we asked: the next gap counts from then, so a slow
        # answer does not push the next poll (and the detection lag) further out.
        asked_at = runtime.clock.now()
        try:
            # A poll longer than half the lease would race the sweeper: give up on it first.
            async with asyncio.timeout(self.lease_s / 2):
                state, value = await spec.poll.poll(ctx, ref)
        except Exception as exc:
            failed = runtime.policy.classify(exc)
            if failed.error.cls is ErrorClass.RETRYABLE:
                log.info("task %s: polling %s failed (%s); polling again", task.id, ref, exc)
                await self._reschedule(task, spec, ctx, ref, asked_at, at_least=failed.retry_after)
                return
            outcome: Outcome = Failed(failed.error, usage=ctx.usage)
        else:
            self.polls += 1
            runtime.upstream_counts.record_poll(finished=state != "running")
            if state == "running":
                await self._reschedule(task, spec, ctx, ref, asked_at)
                return
            started = task.started_at if state == "done" else None
            if started is not None and spec.poll.schedule.observe(started, asked_at):
                await self._hasten(task.kind, asked_at - started)
            outcome = job_outcome(spec, runtime.policy, state, value, ctx.usage)
        item = runtime.decide(task, outcome, runtime.clock.now(), ctx.billed, self._rng)
        await finish_upstream(runtime, task, item, usage=ctx.usage, headers=ctx.response_headers)

    async def _hasten(self, kind: str, took_s: float) -> None:
        """The kind's first job seen finished, after ``took_s``: its parked jobs as old, polled
        on cold gaps so far, are looked at now (best effort: the cold gaps stand otherwise)."""
        runtime = self.runtime
        try:
            moved = await runtime.store.hasten_parked(kind, took_s, runtime.clock.now())
        except Exception:
            log.warning("could not bring the polls of %s forward", kind, exc_info=True)
            return
        if moved:
            self._store_next = None
            self._store_checked_at = float("-inf")  # look again: some are due sooner now
            self.wake()

    async def _reschedule(
        self,
        task: Task,
        spec: KindSpec,
        ctx: Context,
        ref: str,
        asked_at: float,
        *,
        at_least: float | None = None,
    ) -> None:
        """Park again for the next poll, or give up when the poll budget or deadline is spent."""
        runtime = self.runtime
        now = runtime.clock.now()
        polls = task.poll_attempts + 1  # this one included
        # Within the claim batch window of the deadline counts as there: polling again a few
        # milliseconds before it would only spend polls.
        if task.deadline_at is not None and now + self.batch_s >= task.deadline_at:
            await self._give_up(task, spec, ctx, ref, changes.DEADLINE_PASSED)
            return
        if polls >= spec.poll_max_attempts:
            reason = f"the upstream job {ref} was still running after {polls} polls"
            await self._give_up(
                task, spec, ctx, ref, ErrorInfo(ErrorClass.TIMEOUT, "poll_limit", reason)
            )
            return
        # The job's age: since the task first started (the submit follows within moments).
        age = asked_at - (task.started_at if task.started_at is not None else asked_at)
        assert spec.poll is not None  # only kinds with a poller are parked
        delay = spec.poll.schedule.next_delay(age, polls, self._rng)
        at = asked_at + delay
        if at_least is not None:
            at = max(at, now + at_least)
        if task.deadline_at is not None:
            at = min(at, task.deadline_at)  # one last look at the deadline itself
        await self._park_again(task, at, polled=True, headers=ctx.response_headers)

    async def _park_again(
        self,
        task: Task,
        at: float,
        *,
        polled: bool,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        runtime = self.runtime
        assert task.lease_token is not None and task.upstream_ref is not None
        parked = await runtime.store.park(
            task.id, task.lease_token, task.upstream_ref, at, runtime.clock.now(), polled=polled
        )
        if not parked:  # a webhook finished it, a cancel ended it, or the sweeper took it back
            if polled:
                await self._cancelled_mid_poll(task)
            return
        spec = runtime.kinds.get(task.kind)
        if spec.poll is not None and spec.poll.holds_slots:
            # The provider is still working: keep (renew) its slot.
            keep = Settlement(headers=dict(headers or {}), keep_slot=True)
            await runtime.admission.settle(permit_of(runtime, task), keep, runtime.clock.now())
        self.wake(at)

    async def _cancelled_mid_poll(self, task: Task) -> None:
        """A cancel that lands while a poll is out ends the task at once (the poller holds its
        lease) and leaves the attempt open, the job running upstream: ask the provider to stop
        it, and if it did, close the attempt and give its slot back. Otherwise the attempt stays
        open for the sweeper, which holds the slot as long as the job may run."""
        runtime = self.runtime
        current = await runtime.store.get(task.id)
        if current is None or current.status is not Status.CANCELLED or task.upstream_ref is None:
            return
        spec = runtime.kinds.get(task.kind)
        if not await self._cancel_upstream(spec, runtime.context(task), task.upstream_ref):
            return
        error = ErrorInfo(ErrorClass.CANCELLED, "cancelled", "cancelled while a poll was out")
        await finish_upstream(
            runtime, task, self._give_up_on(task, spec, True, Status.CANCELLED, error)
        )

    async def _give_up(
        self, task: Task, spec: KindSpec, ctx: Context, ref: str, error: ErrorInfo
    ) -> None:
        stopped = await self._cancel_upstream(spec, ctx, ref)  # stop paying for unread work
        item = self._give_up_on(task, spec, stopped, Status.TIMEOUT, error)
        await finish_upstream(self.runtime, task, item, headers=ctx.response_headers)

    def _give_up_on(
        self, task: Task, spec: KindSpec, stopped: bool, to: Status, error: ErrorInfo
    ) -> Completion:
        """End a task whose job the provider may go on running unless it said it stopped it:
        then the attempt stays open as long as one call of the kind may run (its slot stays
        taken, in this process and in the one started after a crash, and the same work waits
        for it, with a last look-up for its late success)."""
        now = self.runtime.clock.now()
        return changes.orphaned(task, to, error, None if stopped else now + spec.longest_call_s)

    async def _hand_back(self, task: Task, message: str) -> None:
        error = ErrorInfo(ErrorClass.INTERRUPTED, "not_pollable", message)
        item = changes.handed_back(task, self.runtime.clock.now(), error)
        await finish_upstream(self.runtime, task, item)

    async def _cancel_upstream(self, spec: KindSpec, ctx: Context, ref: str) -> bool:
        """Ask the provider to stop the job: True if it said it did."""
        if spec.poll is None:
            return False
        try:
            return await spec.poll.cancel(ctx, ref)
        except Exception as exc:  # best effort: the task ends either way
            log.info("task %s: cancelling upstream job %s failed: %s", ctx.task_id, ref, exc)
            return False
