"""Recovery and deadlines: the sweeper finds what dead workers left behind.

A worker is dead when the ledger says its process is (its liveness lock is free: the kernel or
the database server released it when the process died, so this is known at once), or, for a
worker that hangs, when its lease expires while the ledger takes writes: a lease that ran out
during a ledger outage says nothing (no worker could renew it, and one holding an outcome it
could not write is writing it still), so after an outage leases are judged again only once
the ledger has been back a whole lease. Each open attempt it held is reconciled:

- the task is still ``running``: an upstream job already submitted -> parked again, its job
  polled at once and its slot held until a poll finds it over (a job that failed sends the
  task back to its handler, which sees ``ctx.upstream_ref``; a kind whose jobs take no slot
  goes back to its handler at once); the provider can look the work up by its key -> take
  the result;
  the provider honours the key -> resubmit (it replays instead of billing again); otherwise
  -> ``failed`` (``interrupted``);
- whatever the task became, a call that may still be running at the provider keeps its
  provider slot, the work and its spend hold until it could have ended (the bound its attempt
  was marked with when it started, from what the kind's calls have taken; see
  ``core/hangup.py``), unless something proved it ended: nobody pays for the same work twice
  and the provider never sees more than the configured concurrency. Then the attempt is
  closed, with a last look-up where the provider has one (a late success is kept); without
  one, it is recorded as possibly billed at its estimate.

Tasks past their deadline end as ``timeout``; a task whose call is running keeps the call going
(its worker closes the attempt; a late success is kept for the same work).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from floodway.core import changes
from floodway.core.outcome import Completion, Failed, Succeeded
from floodway.core.owners import identity_of
from floodway.core.spend import Charge, possibly_billed
from floodway.core.states import TERMINAL, Status
from floodway.core.task import ErrorClass, ErrorInfo, Task
from floodway.kinds import UNBOUNDED_CALL_S, KindSpec
from floodway.limits.base import Permit
from floodway.runtime import Runtime

log = logging.getLogger("floodway.sweeper")


class _Running(enum.Enum):
    RUNNING = "running"


#: a poll said an orphaned upstream job runs on
RUNNING = _Running.RUNNING
#: how an orphaned call ended: its late success (if any) and what it billed
_Ended = tuple[Succeeded | None, Charge | None]


@dataclass
class SweepReport:
    recovered: int = 0  # resumed, looked up or resubmitted
    interrupted: int = 0
    orphans_closed: int = 0
    timed_out: int = 0


class Sweeper:
    def __init__(self, runtime: Runtime, batch: int = 500) -> None:
        self.runtime = runtime
        self.batch = batch
        #: since when the ledger has taken writes, as far as leases go (None: it is out now)
        self._ledger_up_since: float | None = float("-inf")

    def ledger_unavailable(self) -> None:
        """A round found the ledger out: no worker can renew its lease until it is back."""
        self._ledger_up_since = None

    def _leases_judged(self, now: float) -> bool:
        """Whether a lease expired now means its worker hangs: the ledger has been taking
        writes for a whole lease, time for every live worker to renew its own."""
        if self._ledger_up_since is None:
            self._ledger_up_since = now  # this round reached it: back from now
        return now >= self._ledger_up_since + self.runtime.settings.worker.lease

    async def run_once(self) -> SweepReport:
        report = await self.recover()
        report.orphans_closed = await self._close_orphans()
        report.timed_out = await self._deadlines()
        return report

    # -- dead workers ---------------------------------------------------------------------------
    async def recover(self) -> SweepReport:
        """Reconcile every open attempt whose worker is dead (its process, or its lease)."""
        report = SweepReport()
        store, now = self.runtime.store, self.runtime.clock.now()
        owners = await store.lease_owners()
        dead = await store.dead(sorted(_identities(owners))) if owners else set()
        found = await store.expired_leases(now, self.batch) if self._leases_judged(now) else []
        if dead:
            of_dead = [o for o in owners if identity_of(o) in dead]
            found += await store.attempts_of(of_dead, self.batch)
        for task in {t.id: t for t in found}.values():
            await self._reconcile(task, report)
        if report.recovered or report.interrupted:
            log.warning(
                "recovered %d tasks of dead workers (%s), %d failed as interrupted",
                report.recovered,
                ", ".join(sorted(dead)) or "leases expired",
                report.interrupted,
            )
        if dead:  # once all its attempts are reconciled, a dead process is forgotten
            for identity in dead - _identities(await store.lease_owners()):
                await store.forget(identity)
        return report

    async def _reconcile(self, task: Task, report: SweepReport) -> None:
        runtime = self.runtime
        if task.kind not in runtime.kinds:
            log.warning("task %s of kind %r: no handler here to reconcile it", task.id, task.kind)
            return
        spec = runtime.kinds.get(task.kind)
        bound = spec.call_ends_by(task)
        if task.status in TERMINAL:  # it ended, its call went on, and now its worker is gone
            assert task.lease_token is not None
            now = runtime.clock.now()
            if await runtime.store.orphan_attempt(task.id, task.lease_token, bound, now):
                held = spec.slot_held_until(task, bound, now)
                await runtime.admission.hold(self._permit(task), held)
            return
        if spec.follows_job(task):
            await self._follow_again(task, spec, bound, report)
            return
        item = await self._decide(task, spec, bound)
        if item is None:
            return
        (applied,) = await runtime.store.complete([item], runtime.clock.now())
        if not applied.applied:
            return
        if self._may_still_run(task, item):
            # The call may go on at the provider: its slot stays taken until it could have
            # ended (a resubmission of the same work takes it over).
            await runtime.admission.hold(self._permit(task), bound)
        else:  # the dead worker's provider slot is free now (its tokens stay spent)
            await runtime.admission.release_slots(self._permit(task))
        if item.to is Status.FAILED:
            report.interrupted += 1
        else:
            report.recovered += 1

    async def _follow_again(
        self, task: Task, spec: KindSpec, bound: float, report: SweepReport
    ) -> None:
        """The dead worker was polling the task's upstream job, or had just recorded it: the
        task is parked again, polled at once by whoever polls, and the job's slot stays held
        until a poll finds it over (as a restarted process holds a parked task's), not
        given back while the task would wait for admission beside a job still running."""
        runtime = self.runtime
        now = runtime.clock.now()
        assert task.lease_token is not None and task.upstream_ref is not None
        if await runtime.store.park(task.id, task.lease_token, task.upstream_ref, now, now):
            held = spec.slot_held_until(task, bound, now)
            await runtime.admission.hold(self._permit(task), held)
            report.recovered += 1

    async def _decide(self, task: Task, spec: KindSpec, bound: float) -> Completion | None:
        runtime = self.runtime
        now = runtime.clock.now()
        if task.upstream_ref is not None:
            # The provider is (or was) working on it: run the handler again, which resumes
            # the recorded job instead of submitting it anew. Not the task's fault: no attempt.
            resuming = f"resuming upstream job {task.upstream_ref}"
            return changes.handed_back(
                task, now, ErrorInfo(ErrorClass.INTERRUPTED, "worker_lost", resuming)
            )
        if spec.lookup is not None:
            ctx = runtime.context(task)
            try:
                found = await spec.lookup(ctx)
            except Exception as exc:
                log.warning("lookup of %s failed: %s; retrying later", task.id, exc)
                return None
            if found is not None:  # what the provider billed for it is spent now
                return runtime.decide(task, Succeeded(found, ctx.usage), now, ctx.billed)
        message = f"the worker holding the task died mid-call ({task.lease_owner})"
        if spec.idempotent:
            # The provider honours the key: a resubmission joins or replays the same job. At
            # once: nothing the provider said asks for a pause (the attempt still counts, so
            # a task that kills every worker that runs it ends dead).
            lost = ErrorInfo(ErrorClass.RETRYABLE, "worker_lost", message)
            item = runtime.policy.decide(task, Failed(lost, retry_after=0.0), now)
            if item.to in TERMINAL:
                # Out of attempts: nothing resubmits the work to take the call over, so the
                # ledger keeps its attempt open until the call could have ended (a process
                # started after this one dies still holds its slot).
                item = dataclasses.replace(item, orphan_until=max(bound, now))
            return item
        interrupted = ErrorInfo(ErrorClass.INTERRUPTED, "worker_lost", message)
        return changes.orphaned(task, Status.FAILED, interrupted, max(bound, now))

    @staticmethod
    def _may_still_run(task: Task, item: Completion) -> bool:
        """Whether the dead worker's call may still be running at the provider: not when a
        look-up found it done, nor when it only polled a known upstream job."""
        return item.to is not Status.SUCCEEDED and task.upstream_ref is None

    # -- calls nobody could see end -------------------------------------------------------------
    async def _close_orphans(self) -> int:
        """Close the attempts left open without a worker whose call has surely ended now, with
        a last look-up where the provider has one: a late success is the work's result. An
        upstream job has no such bound (it may run far longer than the call that submitted
        it): its attempt is closed when a poll says the job is over, and until then it stays
        open, its slot held, to the next look."""
        runtime = self.runtime
        closed = 0
        for task in await runtime.store.ended_orphans(runtime.clock.now(), self.batch):
            assert task.lease_token is not None
            job = await self._poll_job(task)
            if job is RUNNING:
                await self._look_again(task)
                continue
            result, charge = job if job is not None else await self._look_up(task)
            now = runtime.clock.now()
            closed_now = await runtime.store.close_attempt(
                task.id, task.lease_token, result, now, charge
            )
            if closed_now:
                await runtime.admission.release_slots(self._permit(task))
                closed += 1
        return closed

    async def _poll_job(self, task: Task) -> _Ended | _Running | None:
        """What a poll says of the upstream job an orphaned attempt stands for: it runs on
        (or the poll itself failed: it may), or it is over (a success is the work's result,
        a failure billed nothing). None: the attempt is no upstream job's."""
        runtime = self.runtime
        spec = runtime.kinds.get(task.kind) if task.kind in runtime.kinds else None
        if spec is None or not spec.follows_job(task):
            return None
        assert spec.poll is not None and task.upstream_ref is not None
        ctx = runtime.context(task)
        try:
            state, value = await spec.poll.poll(ctx, task.upstream_ref)
        except Exception as exc:
            if runtime.policy.classify(exc).error.cls is ErrorClass.RETRYABLE:
                return RUNNING
            return None, None
        if state == "running":
            return RUNNING
        if state == "done":
            return Succeeded(value, ctx.usage), runtime.charge(task, ctx.billed)
        return None, None

    async def _look_again(self, task: Task) -> None:
        """An orphaned upstream job still runs: its attempt stays open, and its slot taken,
        until the next poll the kind's schedule sets for a job of its age."""
        runtime = self.runtime
        spec = runtime.kinds.get(task.kind)
        assert spec.poll is not None and task.lease_token is not None
        now = runtime.clock.now()
        started = task.started_at if task.started_at is not None else now
        until = now + spec.poll.schedule.next_delay(now - started, task.poll_attempts + 1)
        if await runtime.store.orphan_attempt(task.id, task.lease_token, until, now):
            await runtime.admission.hold(self._permit(task), spec.slot_held_until(task, until, now))

    async def _look_up(self, task: Task) -> tuple[Succeeded | None, Charge | None]:
        """A late success the provider's look-up finds, and what it billed for it. Without a
        look-up that answered, nobody saw the call end: it is recorded as possibly billed, at
        its estimate (the ledger may over-state the bill, never under-state it)."""
        runtime = self.runtime
        unseen = None, possibly_billed(task.spend_hold)
        if task.kind not in runtime.kinds:
            return unseen
        spec = runtime.kinds.get(task.kind)
        if spec.lookup is None:
            return unseen
        ctx = runtime.context(task)
        try:
            found = await spec.lookup(ctx)
        except Exception as exc:
            log.warning("last look-up of %s failed: %s", task.id, exc)
            return unseen
        if found is None:  # the provider has no finished work under the key: not billed
            return None, None
        return Succeeded(found), runtime.charge(task, ctx.billed)

    # -- deadlines ------------------------------------------------------------------------------
    async def _deadlines(self) -> int:
        runtime = self.runtime
        count = 0
        for task in await runtime.store.past_deadline(runtime.clock.now(), self.batch):
            now = runtime.clock.now()
            item = changes.past_deadline(task, now, self._longest_call(task))
            (applied,) = await runtime.store.complete([item], now)
            if applied.applied and item.orphan_until is not None:
                held = self._held_until(task, item.orphan_until, now)
                await runtime.admission.hold(self._permit(task), held)
            count += applied.applied
        return count

    def _held_until(self, task: Task, until: float, now: float) -> float:
        kinds = self.runtime.kinds
        if task.kind not in kinds:
            return until
        return kinds.get(task.kind).slot_held_until(task, until, now)

    def _longest_call(self, task: Task) -> float:
        kinds = self.runtime.kinds
        return kinds.get(task.kind).longest_call_s if task.kind in kinds else UNBOUNDED_CALL_S

    def _permit(self, task: Task) -> Permit:
        return self.runtime.admission.permit_for(
            task.id, task.kind, task.tenant, task.cost_estimated
        )


def _identities(owners: Iterable[str]) -> set[str]:
    return {i for o in owners if (i := identity_of(o)) is not None}
