"""Inbound provider callbacks: finish the task waiting on the job a callback reports.

The API's ``POST /v1/webhooks/{kind}`` checks the signature (:mod:`floodway.wire.signing`) with the
kind's ``webhook_secret``, then calls :func:`apply_callback` with the parsed JSON. The kind's
:class:`~floodway.kinds.JobPoller` reads the body the way its poll reads a job.

A callback and a poll may race: both are compare-and-set writes on the task, the first one wins
and the other changes nothing, so a late, duplicated or replayed callback is harmless.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from floodway.core.outcome import Failed, Outcome
from floodway.core.spend import Usage
from floodway.core.states import Status
from floodway.core.task import ErrorClass, ErrorInfo, Task
from floodway.core.upstream import JobView
from floodway.kinds import KindSpec, read_callback
from floodway.runtime import Runtime
from floodway.worker.upstream import finish_upstream, job_outcome

#: a parked task is waited for this long when a callback arrives before it is parked
SETTLE_WAIT_S = 2.0
_RECHECK_S = 0.05


@dataclass(frozen=True)
class Applied:
    """What a callback did: ``applied`` when it wrote the task's new status (False: nothing to
    do: the job still runs, the task already ended, or a poll got there first); ``task`` is the
    task waiting on the job as it was found (None: no task waits on it)."""

    applied: bool
    task: Task | None


async def apply_callback(
    runtime: Runtime, kind: str, payload: Any, *, settle_wait_s: float = SETTLE_WAIT_S
) -> Applied:
    """Finish the task of ``kind`` waiting on the job ``payload`` describes.

    Raises :class:`~floodway.core.errors.UnknownKind` for a kind nobody declared and
    ``ValueError`` for a payload without a job id (answer 4xx)."""
    spec = runtime.kinds.get(kind)
    ref, view = (spec.poll.read_callback if spec.poll else read_callback)(payload)
    if ref is None:
        raise ValueError("the callback names no job id")
    if view.state == "running":
        return Applied(False, await runtime.store.find_upstream(kind, ref))
    # A callback can outrun the handler that submitted the job: give it a moment to record
    # the job id and park, and give a poll in progress a moment to finish.
    give_up = runtime.clock.now() + settle_wait_s
    while True:
        task = await runtime.store.find_upstream(kind, ref)
        if task is not None and task.status is not Status.RUNNING:
            return Applied(False, task)
        if task is not None and task.parked:
            outcome = _outcome(spec, runtime, view)
            billed = None if view.usage is None else Usage(input_tokens=view.usage)
            decided = runtime.decide(task, outcome, runtime.clock.now(), billed)
            item = dataclasses.replace(decided, lease_token=None, parked=True)
            if await finish_upstream(runtime, task, item, usage=view.usage):
                return Applied(True, task)
        if runtime.clock.now() >= give_up:
            return Applied(False, task)
        await runtime.clock.sleep(_RECHECK_S)


def _outcome(spec: KindSpec, runtime: Runtime, view: JobView) -> Outcome:
    if view.state == "failed" and view.fatal:
        # Resubmitting would fail the same way (a refusal, a bad request): as the poll does.
        error = ErrorInfo(ErrorClass.FATAL, view.error_type or "upstream_failed", view.message)
        return Failed(error, usage=view.usage)
    value = view.result if view.state == "done" else view.message
    return job_outcome(spec, runtime.policy, view.state, value, view.usage)
