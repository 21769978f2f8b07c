"""A worker: claims tasks its process has handlers for, runs them, writes the outcome.

dispatcher (claim loop) -> executor (one task -> outcome) -> retry policy (outcome -> write)
-> completer (compare-and-set under ``asyncio.shield``). Heartbeats renew leases and carry
cancel requests; a lost lease fences the execution (its write would be refused anyway).

Claiming and completing overlap: a slot is free again once its handler has returned, while
the outcome is still being written (claims pause while more than ``concurrency`` outcomes
wait to be written). A worker claims only for its free slots: a claim opens the task's
attempt, and recovery after a crash takes every open attempt for a call that may have been
sent, so a task claimed to wait in this process would fail with the crash it had no part in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from floodway.clock import wait_event
from floodway.config import WorkerConfig
from floodway.context import Context
from floodway.core import changes
from floodway.core.errors import Unavailable
from floodway.core.hangup import Provider, Why, held_until, on_hang_up, unseen_call_s
from floodway.core.outcome import Applied, Completion, Failed, Parked
from floodway.core.owners import owner_name
from floodway.core.spend import possibly_billed
from floodway.core.states import Status
from floodway.core.task import ErrorClass, ErrorInfo, Task, new_token
from floodway.kinds import UNBOUNDED_CALL_S
from floodway.limits.base import Permit, Settlement
from floodway.runtime import Runtime
from floodway.store.base import ClaimParams, ReadyQuery, WorkerInfo
from floodway.worker.completer import Completer
from floodway.worker.executor import execute
from floodway.worker.upstream import UpstreamPoller

log = logging.getLogger("floodway.worker")

_DEFAULTS = WorkerConfig()
#: a worker writes its row (GET /v1/workers) this often; a row silent for a day is dropped
WORKER_BEAT_S = 5.0
WORKER_STALE_S = 86400.0
#: open attempts whose provider slots a starting worker holds again, at most
OPEN_ATTEMPTS_HELD = 10_000
#: the pause before an outcome the ledger did not take is written again (doubling), at most
OUTCOME_RETRY_FIRST_S = 0.05
OUTCOME_RETRY_LONGEST_S = 2.0


@dataclass
class _Running:
    task: Task
    ctx: Context
    permit: Permit
    job: asyncio.Task[None] | None = None
    fenced: bool = False


@dataclass
class WorkerOptions:
    concurrency: int = _DEFAULTS.concurrency
    lease_s: float = _DEFAULTS.lease
    #: renew leases this often: well within a lease, at most every 2 s (the limiter's
    #: recovery window counts on it)
    heartbeat_s: float = min(2.0, _DEFAULTS.lease / 3)
    grace_s: float = _DEFAULTS.grace
    claim_batch: int = _DEFAULTS.claim_batch
    idle_poll_s: float = 1.0
    #: the lease owner's name; default: this process's identity on the ledger and a number
    owner: str | None = None

    @classmethod
    def from_config(cls, cfg: WorkerConfig, **overrides: Any) -> WorkerOptions:
        options = cls(
            concurrency=cfg.concurrency,
            lease_s=cfg.lease,
            heartbeat_s=min(2.0, cfg.lease / 3),
            grace_s=cfg.grace,
            claim_batch=cfg.claim_batch,
        )
        return dataclasses.replace(options, **overrides)


class Worker:
    _numbers = itertools.count(1)

    def __init__(self, runtime: Runtime, options: WorkerOptions | None = None) -> None:
        self.runtime = runtime
        options = options or WorkerOptions()
        if options.owner is None:
            owner = owner_name(runtime.store.identity, f"w{next(self._numbers)}")
            options = dataclasses.replace(options, owner=owner)
        self.options = options
        self.running: dict[str, _Running] = {}
        #: handlers that may run at once
        self._slots = asyncio.Semaphore(self.options.concurrency)
        #: tasks of ``running`` whose handler has returned: their outcome is being written
        self._writing = 0
        #: outcomes the ledger did not take, held and tried again (they count as running)
        self._unwritten = 0
        self._stopping = asyncio.Event()
        #: stopped past the grace period: outcomes the ledger does not take are let go
        self._torn_down = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._confirming: set[asyncio.Task[None]] = set()
        #: when a pass next lists the queue of every kind, full resources' work included
        self._look_all_at = 0.0
        #: ready tasks the last claim left waiting for a slot (None: more than it listed, or
        #: the listing left out the kinds of full resources, whose queues it did not count)
        self._waiting: int | None = None
        self.completed = 0
        #: provider slots given back so far; of them, those the current pass began after, and
        #: those a pass has handed on (queued its claim, or found nothing to claim)
        self._slots_freed = 0
        self._pass_saw = 0
        self._handed = 0
        #: outcomes' writes waiting for the hand-off of the slots freed before them (the
        #: completer's module says why): how many must be handed on, and the future to resolve
        self._handing: list[tuple[int, asyncio.Future[None]]] = []
        self.completer = Completer(runtime.store, runtime.clock, claims_first=self._claims_queued)
        #: retries this worker scheduled (a heap of due times): the idle wait ends at the
        #: earliest, not a poll interval later
        self._due: list[float] = []
        # -- upstream jobs: parked tasks are polled by this loop, not by a held worker slot --
        self.poller = UpstreamPoller(
            runtime, owner=self.owner, lease_s=self.options.lease_s, idle_s=self.options.idle_poll_s
        )

    @property
    def owner(self) -> str:
        assert self.options.owner is not None  # named in __init__
        return self.options.owner

    async def start(self) -> None:
        """Before the first claim, count the calls that may still be running at the provider
        for tasks of a process that died: their slots are held until those calls have ended."""
        await self._hold_open_attempts()
        self._loops = [
            asyncio.create_task(self._dispatch_loop(), name="floodway-dispatch"),
            asyncio.create_task(self._heartbeat_loop(), name="floodway-heartbeat"),
            asyncio.create_task(self.poller.run(), name="floodway-upstream"),
            asyncio.create_task(self._beat_loop(), name="floodway-worker-beat"),
        ]

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop claiming; let running tasks finish within the grace period; release the
        rest back to the queue (not counted as a crash, not counted as an attempt)."""
        self._stopping.set()
        self._slot_freed.set()
        for loop in self._loops[:1]:
            loop.cancel()
        grace = self.options.grace_s if grace_s is None else grace_s
        jobs = [r.job for r in self.running.values() if r.job is not None]
        pending: set[asyncio.Task[None]] = set()
        if jobs:
            _, pending = await asyncio.wait(jobs, timeout=grace)
        self._torn_down.set()
        for job in pending:
            job.cancel()
        if pending:
            await asyncio.wait(pending)
        if self._confirming:
            await asyncio.wait(self._confirming)
        for loop in self._loops:
            loop.cancel()
        for loop in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        try:
            await self.runtime.store.worker_gone(self.owner)
        except Exception as exc:  # its row goes stale and is dropped in a day
            log.warning("could not remove worker %s from the ledger: %s", self.owner, exc)

    async def _hold_open_attempts(self) -> None:
        """In-process limits start empty: a process that restarts after a crash would
        otherwise send new calls beside the ones the provider still serves for the dead
        process. With Redis the slots outlive the process, and holding them again is
        harmless."""
        runtime = self.runtime
        for task in await runtime.store.open_attempts(OPEN_ATTEMPTS_HELD):
            if task.kind not in runtime.kinds:
                continue
            spec = runtime.kinds.get(task.kind)
            if task.parked and spec.poll is not None and not spec.poll.holds_slots:
                continue  # a line of a provider batch: no call of its own in flight
            now = runtime.clock.now()
            if task.parked:  # its job runs upstream: held until its poll or callback ends it
                until = now + UNBOUNDED_CALL_S
            else:
                # Its worker died (no owner), or it is leased to one that may have: held until
                # its call could have ended, or, for a job the worker was following (its
                # handler recorded it, or its poller was polling it), until a poll sees the job
                # over; the bound of the call that submitted it says nothing of the job's end.
                if task.lease_owner is None:
                    ends = task.lease_expires_at or now
                else:
                    ends = spec.call_ends_by(task)
                until = spec.slot_held_until(task, ends, now)
            permit = runtime.admission.permit_for(
                task.id, task.kind, task.tenant, task.cost_estimated
            )
            await runtime.admission.hold(permit, until)

    def cancel_local(self, task_id: str) -> None:
        """A cancel request reached this process. A handler running here is told (it may
        stop its call cleanly), and floodway reads the call to its end (the cancel ended the
        task; see core/hangup.py); a task parked on an upstream job has its poll made due,
        and the poll asks the provider to stop the job."""
        run = self.running.get(task_id)
        if run is None:
            self.poller.wake(self.runtime.clock.now())
            return
        run.ctx.cancelled.set()

    # -- dispatcher ---------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        runtime = self.runtime
        hub = runtime.hub
        while not self._stopping.is_set():
            # Cleared before the pass, not after it: what happens while it lists and claims
            # (a job's next step written, a slot freed) leaves its wake-up for the next pass.
            hub.work_available.clear()
            self._slot_freed.clear()
            self._pass_saw = self._slots_freed
            free = self._free()
            claimed = 0
            if free > 0:
                try:
                    claimed = await self._claim(min(free, self.options.claim_batch))
                except Unavailable as exc:
                    self._hand_on(self._slots_freed)
                    # Fail closed: claim nothing until the limiter and the ledger answer.
                    log.warning("dispatch paused, retrying in 1 s: %s: %s", type(exc).__name__, exc)
                    await runtime.clock.sleep(1.0)
                    continue
                except Exception:
                    self._hand_on(self._slots_freed)
                    log.exception("claim failed; backing off")
                    await runtime.clock.sleep(1.0)
                    continue
            self._hand_on(self._pass_saw)
            if claimed and claimed == min(free, self.options.claim_batch):
                continue  # maybe more ready: claim again at once
            if free - claimed <= 0:
                self._hand_on(self._slots_freed)  # no pass until a slot of this worker frees
                await self._slot_freed.wait()
                continue
            await self._idle_wait()
        self._hand_on(self._slots_freed)

    def _claims_queued(self) -> asyncio.Future[None] | None:
        """For an outcome about to be written: a future resolved once the provider slots freed
        so far are handed on; None if they are."""
        if self._handed >= self._slots_freed:
            return None
        done = asyncio.get_running_loop().create_future()
        self._handing.append((self._slots_freed, done))
        return done

    def _hand_on(self, freed: int) -> None:
        """The slots freed up to ``freed`` are handed on: their outcomes may be written."""
        self._handed = max(self._handed, freed)
        waiting = []
        for need, done in self._handing:
            if need > self._handed:
                waiting.append((need, done))
            elif not done.done():
                done.set_result(None)
        self._handing = waiting

    def _free(self) -> int:
        """How many tasks to claim now: the free slots; fewer while more than ``concurrency``
        outcomes wait to be written (the ledger is the bottleneck then: more claims would only
        queue behind)."""
        concurrency = self.options.concurrency
        running = len(self.running) - self._writing
        return min(concurrency - running, 2 * concurrency - len(self.running))

    async def _idle_wait(self) -> None:
        """Free slots and nothing claimable: wait for work (a submit or a change anywhere,
        a provider slot given back, a retry due). A slot of this worker freed meanwhile is
        no reason to look again: there were free ones already."""
        runtime = self.runtime
        timeout = self.options.idle_poll_s
        now = runtime.clock.now()
        hint = runtime.admission.next_admission_in(now)
        if hint is not None:
            timeout = max(0.001, min(timeout, hint))
        while self._due and self._due[0] <= now:
            heapq.heappop(self._due)
        if self._due:
            timeout = max(0.001, min(timeout, self._due[0] - now))
        local = asyncio.ensure_future(
            wait_event(runtime.clock, runtime.hub.work_available, timeout)
        )
        remote = asyncio.ensure_future(runtime.store.wait_for_change(timeout))
        try:
            await asyncio.wait({local, remote}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for f in (local, remote):
                f.cancel()

    async def _claim(self, limit: int) -> int:
        runtime = self.runtime
        now = runtime.clock.now()
        kinds = runtime.kinds.names()
        bounds = runtime.call_bounds()
        params = ClaimParams(
            self.owner, new_token(), kinds, limit, now, self.options.lease_s, bounds=bounds
        )
        permits: dict[str, Permit] = {}
        if runtime.admission.limited:
            # Every completion and submit in any process wakes every dispatcher. One slot
            # count per resource tells which kinds could start now: only their work is listed
            # and offered to admission, not the queue of every full resource on each slot
            # freed elsewhere. Once per idle period the whole queue is looked at anyway: a task
            # that became due may take over a slot its own orphaned call holds, which the
            # counts show as taken.
            listing = kinds
            if now < self._look_all_at:
                room = await runtime.admission.room(kinds)
                if not room.kinds:
                    return 0
                listing = room.kinds
                if room.most is not None:
                    limit = min(limit, room.most)
            else:
                self._look_all_at = now + self.options.idle_poll_s
            listed = max(limit, 16)
            ready = await runtime.store.ready(ReadyQuery(listing, now, listed))
            admitted = await runtime.admission.admit(ready, now, limit=limit) if ready else []
            permits = {p.task_id: p for p in admitted}
            complete = len(ready) < listed and listing == kinds
            self._waiting = len(ready) - len(permits) if complete else None
            if not permits:
                return 0
            params = ClaimParams(
                self.owner,
                params.token,
                kinds,
                limit,
                now,
                self.options.lease_s,
                ids=tuple(permits),
                bounds=bounds,
            )
        self._hand_on(self._pass_saw)  # queued by the time the outcomes' writer runs
        try:
            tasks = await runtime.store.claim(params)
        except BaseException:
            # The claim did not land (e.g. PostgreSQL restarting): hand the slots back now
            # rather than leave them held until they expire.
            for permit in permits.values():
                await runtime.admission.release(permit, now)
            raise
        if not runtime.admission.limited:
            self._waiting = 0 if len(tasks) < limit else None
        got = {t.id for t in tasks}
        for task_id, permit in permits.items():
            if task_id not in got:
                await runtime.admission.release(permit, now)
        for task in tasks:
            permit = permits.get(task.id) or Permit(task.id, None, task.tenant, task.cost_estimated)
            ctx = runtime.context(task)
            run = _Running(task, ctx, permit)
            self.running[task.id] = run
            if task.cancel_requested:
                ctx.cancelled.set()
            run.job = asyncio.create_task(self._run(run), name=f"floodway-task-{task.id}")
        confirmed = [permits[t.id] for t in tasks if t.id in permits]
        if confirmed:
            confirm = asyncio.create_task(self._confirm_slots(confirmed))
            self._confirming.add(confirm)
            confirm.add_done_callback(self._confirming.discard)
        return len(tasks)

    async def _confirm_slots(self, permits: list[Permit]) -> None:
        """The claims landed: hold their provider slots for as long as the tasks run (a slot
        taken at admission lasts only the claim TTL). Beside the calls, not before them: the
        order does not matter, a renewal that comes after a release renews nothing."""
        try:
            await self.runtime.admission.renew(permits)
        except Exception:  # the next heartbeat tries again, well within the claim TTL
            log.warning("could not confirm the limiter slots of %d claims", len(permits))

    # -- one task -----------------------------------------------------------------------------
    async def _run(self, run: _Running) -> None:
        runtime = self.runtime
        spec = runtime.kinds.get(run.task.kind)
        try:
            if not await self._take_slot():
                await self._hand_back(run)
                return
            try:
                run.permit = await runtime.admission.sending(run.permit)
                try:
                    outcome = await execute(spec, run.ctx, runtime.policy, runtime.clock)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug in floodway, not in the handler: never lose the task
                    log.exception("executor failed on %s", run.task.id)
                    outcome = Failed(ErrorInfo(ErrorClass.RETRYABLE, "internal", "executor failed"))
                self._returned()
            finally:
                self._slots.release()
        except asyncio.CancelledError:  # torn down by stop(), past its grace, mid-call
            item, settlement = self._hang_up(run, Why.SHUTDOWN, None)
            self._writing += 1
            await asyncio.shield(self._finish(run, item, settlement))
            return
        if isinstance(outcome, Failed) and outcome.hung_up:
            # It outlived its timeout: later attempts' bounds count it as running one more.
            runtime.call_times.record(run.task.kind, unseen_call_s(spec.longest_call_s))
            item, settlement = self._hang_up(run, Why.TIMEOUT, outcome)
            await asyncio.shield(self._finish(run, item, settlement))
            return
        self._timed(run)
        if isinstance(outcome, Parked):  # an upstream job: wait on a durable timer, not here
            if spec.poll is not None:
                await asyncio.shield(self._park(run, outcome))
                return
            message = f"the handler parked on {outcome.ref}, but kind {spec.name!r} has no poll"
            outcome = Failed(ErrorInfo(ErrorClass.FATAL, "not_pollable", message))
        runtime.upstream_counts.record(outcome)
        now = runtime.clock.now()
        item = runtime.decide(run.task, outcome, now, run.ctx.billed)
        failed = outcome if isinstance(outcome, Failed) else None
        if failed is not None and self._retry_now(run.task, item, failed):
            item = dataclasses.replace(item, next_attempt_at=now)
        in_progress = failed is not None and failed.in_progress
        settlement = Settlement(
            actual_cost=run.ctx.usage,
            throttled=failed is not None and failed.throttled,
            retry_after=None if failed is None else failed.retry_after,
            headers=run.ctx.response_headers,
            still_running_s=spec.longest_call_s if in_progress else None,
            reason=f"{failed.error.type}: {failed.error.message}" if failed is not None else "",
        )
        await asyncio.shield(self._finish(run, item, settlement))

    def _timed(self, run: _Running) -> None:
        """A call that answered: how long it took is what later calls of its kind are
        bounded by."""
        started = run.task.attempt_at
        if started is not None:
            self.runtime.call_times.record(run.task.kind, self.runtime.clock.now() - started)

    def _hang_up(
        self, run: _Running, why: Why, failed: Failed | None
    ) -> tuple[Completion, Settlement]:
        """The write and the slot for a call this worker stopped waiting for, which may go on
        at the provider: as the hang-up rule says (core/hangup.py). Its provider slot is held
        until the call could have ended; a resend of the same work takes that slot over."""
        runtime, task = self.runtime, run.task
        spec = runtime.kinds.get(task.kind)
        now = runtime.clock.now()
        until = held_until(why, now, spec.call_ends_by(task), spec.longest_call_s)
        settlement = Settlement(
            headers=run.ctx.response_headers, still_running_s=max(0.0, until - now)
        )
        verdict = on_hang_up(why, spec.provider, spec.retry_timeouts)
        if failed is None:  # a shutdown: not the task's failure, no attempt spent on it
            lost = ErrorInfo(ErrorClass.RETRYABLE, "shutdown", "the worker stopped mid-call")
            failed = Failed(lost, retry_after=0.0, in_progress=True)
        if verdict.resend:
            item = runtime.decide(task, failed, now, run.ctx.billed)
            if item.to is Status.RETRYING and spec.provider is not Provider.KEYED:
                # Not beside the first call, which may bill too: it is recorded as possibly
                # billed. (To a provider that honours keys, the resend joins the first call
                # at once, and its answer says the bill.)
                due = max(until, item.next_attempt_at or now)
                possibly = possibly_billed(task.spend_hold)
                item = dataclasses.replace(item, next_attempt_at=due, charge=possibly)
            elif item.to is not Status.RETRYING:  # out of attempts, or past the deadline
                item = dataclasses.replace(item, orphan_until=until)
            return dataclasses.replace(item, hung_up_until=until), settlement
        unknown = "the provider may have billed it (billing unknown)"
        if why is Why.TIMEOUT:
            error = ErrorInfo(ErrorClass.TIMEOUT, "timeout", f"{failed.error.message}; {unknown}")
            to = Status.TIMEOUT
        else:
            error = ErrorInfo(
                ErrorClass.INTERRUPTED, failed.error.type, f"{failed.error.message}; {unknown}"
            )
            to = Status.FAILED
        item = changes.orphaned(task, to, error, until)
        charge = runtime.charge(task, run.ctx.billed)
        return dataclasses.replace(item, charge=charge, hung_up_until=until), settlement

    def _retry_now(self, task: Task, item: Completion, failed: Failed) -> bool:
        """A task's first failure, retried at once while fewer tasks wait for a slot than
        this worker has calls in flight: each of those calls frees a slot within a call's
        time, so the waiting ones all start within about one, and a backoff (up to half a
        second at first) would only leave the provider's room idle once they have (the last
        wave of a batch waiting on one 5xx). It goes again through admission like any other.
        A throttle or a Retry-After keeps its wait, later retries back off, and so does a
        first failure behind a long queue: an outage still spreads them."""
        in_flight = len(self.running) - self._writing
        return (
            self._waiting is not None
            and self._waiting < max(1, in_flight)
            and item.to is Status.RETRYING
            and item.next_attempt_at is not None
            and task.attempts == 1
            and not failed.throttled
            and not failed.in_progress
            and failed.retry_after is None
        )

    async def _take_slot(self) -> bool:
        """A slot for the handler (claims are for free slots: one is there); False when the
        worker is stopping and the task should go back to the queue instead."""
        await self._slots.acquire()
        if self._stopping.is_set():
            self._slots.release()
            return False
        return True

    async def _hand_back(self, run: _Running) -> None:
        """Back to the queue, no attempt spent: never started, or torn down by stop()."""
        item = changes.handed_back(run.task, self.runtime.clock.now())
        self._writing += 1
        await asyncio.shield(self._finish(run, item, Settlement()))

    def _returned(self) -> None:
        """A handler returned: its slot is free for the next task while its outcome is
        written."""
        self._writing += 1
        self._slot_freed.set()

    async def _finish(self, run: _Running, item: Completion, settlement: Settlement) -> None:
        runtime = self.runtime
        if run.ctx.upstream_request_id is not None:
            item = dataclasses.replace(item, upstream_request_id=run.ctx.upstream_request_id)
        try:
            await runtime.admission.settle(run.permit, settlement, runtime.clock.now())
            self._provider_slot_freed()
            if run.fenced:
                log.warning("task %s: lease lost, result dropped", run.task.id)
                return
            try:
                applied = await self._write_outcome(item)
            except Exception:
                # A bug, not an outage: the lease will expire and the sweeper reconciles it.
                log.exception("could not write the outcome of %s", run.task.id)
                return
            if applied.applied and item.next_attempt_at is not None:
                heapq.heappush(self._due, item.next_attempt_at)
            if not applied.applied and not applied.closed:
                log.warning(
                    "task %s: outcome %s refused (now %s)",
                    run.task.id,
                    item.to.value,
                    applied.status,
                )
            self.completed += 1
        finally:
            self.running.pop(run.task.id, None)
            self._writing -= 1
            self._slot_freed.set()

    def _provider_slot_freed(self) -> None:
        """A provider slot was given back: let the dispatchers admit the next task now, while
        the outcome is still being written, rather than after. Without limits a slot frees
        nothing."""
        if self.runtime.admission.limited:
            self._slots_freed += 1
            self.runtime.hub.work_available.set()

    async def _write_outcome(self, item: Completion) -> Applied:
        """Write ``item`` until the ledger takes it: an outcome in hand (a call the provider
        may have billed) is never dropped. While the ledger takes no write (a full disk, a
        read-only database, an outage) the task holds its worker slot (no claim for work
        whose outcome could not be written either) and its lease (the heartbeat renews it as
        soon as writes land again, before the sweeper could take it); the write is tried
        again with backoff until it lands or the worker is stopped past its grace. Logged
        once per outage, not once per outcome."""
        pause = OUTCOME_RETRY_FIRST_S
        held = False
        try:
            while True:
                try:
                    return await self.completer.write(item)
                except Unavailable as exc:
                    if self._torn_down.is_set():
                        raise  # stopped past its grace: recovery decides, as after a crash
                    if not held:
                        held = True
                        self._writing -= 1
                        self._unwritten += 1
                        if self._unwritten == 1:
                            log.warning("the ledger takes no outcome, holding them: %s", exc)
                await wait_event(self.runtime.clock, self._torn_down, pause)
                pause = min(2 * pause, OUTCOME_RETRY_LONGEST_S)
        finally:
            if held:
                self._writing += 1
                self._unwritten -= 1
                if self._unwritten == 0:
                    log.warning("the ledger takes outcomes again")

    # -- upstream jobs ------------------------------------------------------------------------
    async def _park(self, run: _Running, park: Parked) -> None:
        """Leave the task waiting on its upstream job without this worker: it stays running,
        the lease and the worker slot are released, the provider slot is kept, and the
        upstream poller wakes it at ``park.poll_at``."""
        runtime = self.runtime
        try:
            # Usage is settled when the job ends (by the poller or the webhook), not here.
            keep = Settlement(headers=run.ctx.response_headers, keep_slot=park.holds_slot)
            await runtime.admission.settle(run.permit, keep, runtime.clock.now())
            if not park.holds_slot:  # a batch line waits without a provider slot
                self._provider_slot_freed()
            if run.fenced:
                log.warning("task %s: lease lost, not parked", run.task.id)
                return
            assert run.task.lease_token is not None
            try:
                parked = await runtime.store.park(
                    run.task.id, run.task.lease_token, park.ref, park.poll_at, runtime.clock.now()
                )
            except Exception:
                # The lease will expire; the sweeper resumes the task from its upstream_ref.
                log.exception("could not park %s", run.task.id)
                return
            if parked:
                self.poller.wake(park.poll_at)
            else:
                log.warning("task %s: lease lost, not parked", run.task.id)
        finally:
            self.running.pop(run.task.id, None)
            self._writing -= 1
            self._slot_freed.set()

    # -- what GET /v1/workers shows --------------------------------------------------------------
    async def _beat_loop(self) -> None:
        runtime = self.runtime
        info = WorkerInfo(
            owner=self.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            concurrency=self.options.concurrency,
            kinds=runtime.kinds.names(),
            started_at=runtime.clock.now(),
            heartbeat_at=runtime.clock.now(),
        )
        while True:
            try:
                await runtime.store.worker_beat(info, runtime.clock.now(), WORKER_STALE_S)
            except Exception as exc:  # the ledger is away: the next beat tries again
                log.warning("worker beat failed: %s", exc)
            await runtime.clock.sleep(WORKER_BEAT_S)

    # -- leases -------------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        runtime = self.runtime
        failing = False
        while True:
            await runtime.clock.sleep(self.options.heartbeat_s)
            leases = [
                (r.task.id, r.task.lease_token or "") for r in self.running.values() if not r.fenced
            ]
            if not leases:
                continue
            try:
                result = await runtime.store.heartbeat(
                    leases, runtime.clock.now(), self.options.lease_s
                )
            except Unavailable as exc:  # an outage: said once, tried again each round
                if not failing:
                    log.warning("heartbeats fail, retrying: %s", exc)
                failing = True
                continue
            except Exception:
                log.exception("heartbeat failed")
                continue
            failing = False
            for task_id in result.lost:
                run = self.running.get(task_id)
                if run is not None:  # fencing: stop working for a lease we no longer hold
                    run.fenced = True
                    run.ctx.lose_lease()
            for task_id in result.cancel_requested:
                self.cancel_local(task_id)
            try:  # keep the provider slots of long tasks alive with their leases
                await runtime.admission.renew([r.permit for r in self.running.values()])
            except Exception:
                log.exception("renewing limiter slots failed")
