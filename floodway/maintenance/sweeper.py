"""Recovery and deadlines: the sweeper finds what dead workers left behind.

A running task whose lease expired belongs to a dead worker. Reconcile it (DESIGN section 3):
an upstream job already submitted -> resume it (the handler sees ``ctx.upstream_ref``); the
provider can look the work up by idempotency key -> take its result; else resubmit if the kind
is idempotent upstream, otherwise fail it as ``interrupted``. Tasks past their deadline end
as ``timeout``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from floodway.core.outcome import Completion, Failed, from_running
from floodway.core.states import Status
from floodway.core.task import ErrorClass, ErrorInfo, Task
from floodway.runtime import Runtime

log = logging.getLogger("floodway.sweeper")


@dataclass
class SweepReport:
    recovered: int = 0  # resumed, looked up or resubmitted
    interrupted: int = 0
    timed_out: int = 0


class Sweeper:
    def __init__(self, runtime: Runtime, batch: int = 500) -> None:
        self.runtime = runtime
        self.batch = batch

    async def run_once(self) -> SweepReport:
        report = SweepReport()
        now = self.runtime.clock.now()
        for task in await self.runtime.store.expired_leases(now, self.batch):
            item = await self._reconcile(task)
            if item is None:
                continue
            applied = await self.runtime.store.complete([item], self.runtime.clock.now())
            if applied[0].applied:
                # The dead worker's provider slot is free now (its tokens stay spent).
                admission = self.runtime.admission
                await admission.release_slots(
                    admission.permit_for(task.id, task.kind, task.tenant, task.cost_estimated)
                )
                if item.to is Status.FAILED:
                    report.interrupted += 1
                else:
                    report.recovered += 1
                await self.runtime.after_completion(task, item, applied[0])
        report.timed_out = await self._deadlines()
        return report

    async def _reconcile(self, task: Task) -> Completion | None:
        runtime = self.runtime
        if task.kind not in runtime.kinds:
            log.warning("task %s of kind %r: no handler here to reconcile it", task.id, task.kind)
            return None
        spec = runtime.kinds.get(task.kind)
        now = runtime.clock.now()

        def to(status: Status, **kw: Any) -> Completion:
            return from_running(task, status, **kw)

        if task.upstream_ref is not None:
            # The provider is (or was) working on it: run the handler again, which resumes
            # the recorded job instead of submitting it anew. Not the task's fault: no attempt.
            return to(
                Status.RETRYING,
                next_attempt_at=now,
                refund_attempt=True,
                error=ErrorInfo(
                    ErrorClass.INTERRUPTED,
                    "worker_lost",
                    f"resuming upstream job {task.upstream_ref}",
                ),
            )
        if spec.lookup is not None:
            try:
                found = await spec.lookup(runtime.context(task))
            except Exception as exc:
                log.warning("lookup of %s failed: %s; retrying later", task.id, exc)
                return None
            if found is not None:
                return to(Status.SUCCEEDED, result=found)
        interrupted = ErrorInfo(
            ErrorClass.INTERRUPTED,
            "worker_lost",
            f"the worker holding the task died (lease of {task.lease_owner} expired)",
        )
        if spec.idempotent:
            retry = Failed(ErrorInfo(ErrorClass.RETRYABLE, "worker_lost", interrupted.message))
            return runtime.policy.decide(task, retry, now)
        return to(Status.FAILED, error=interrupted)

    async def _deadlines(self) -> int:
        runtime = self.runtime
        count = 0
        for task in await runtime.store.past_deadline(runtime.clock.now(), self.batch):
            error = ErrorInfo(ErrorClass.TIMEOUT, "deadline", "the task's deadline passed")
            item = Completion(
                task.id,
                Status.TIMEOUT,
                task.status,
                task.lease_token if task.status is Status.RUNNING else None,
                error=error,
                # a parked task (waiting on its upstream job) has no lease: the CAS checks parked
                parked=task.parked,
            )
            applied = await runtime.store.complete([item], runtime.clock.now())
            if applied[0].applied and task.status is Status.RUNNING:
                # a running or parked task held a provider slot: give it back
                await runtime.admission.release_slots(
                    runtime.admission.permit_for(
                        task.id, task.kind, task.tenant, task.cost_estimated
                    )
                )
            count += applied[0].applied
        return count
