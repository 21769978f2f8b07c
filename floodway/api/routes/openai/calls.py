"""One OpenAI call as a floodway task: submitted in the caller's tenant, run inside the
resource's limits with floodway's retries, and awaited within the client's deadline.

The client's deadline is the read timeout the official Python SDK sends
(``X-Stainless-Read-Timeout``), less a margin so the answer arrives before the client gives up,
and never past the kind's ``deadline``. A provider 429 or 5xx is floodway's to retry; the
client sees a 429 only when the task would not end within its deadline, with a Retry-After
floodway computed: the time to the task's next attempt plus the median time recent calls of
the kind took. The work goes on meanwhile, so asking again (the same body, or the same
Idempotency-Key) collects it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

from fastapi.responses import JSONResponse

from floodway.api.problems import ApiProblem
from floodway.api.routes.openai.headers import TASK_HEADER, rate_headers, task_headers
from floodway.api.state import ApiState
from floodway.core.errors import WaitTimeout
from floodway.core.job_durations import JobDurations
from floodway.core.states import Status
from floodway.core.task import Lane, SubmitRequest, Task
from floodway.wire.openai import task_failure
from floodway.wire.problems import retry_after_header
from floodway.wire.tasks import printable

READ_TIMEOUT = "x-stainless-read-timeout"
RETRY_COUNT = "x-stainless-retry-count"
#: a call with no known duration yet is assumed to take this long (for Retry-After)
FIRST_GUESS_S = 1.0
#: the longest a request waits between two looks at its task (a retry may be foreseen late)
LOOK_EVERY_S = 1.0


def wait_budget(headers: Mapping[str, str], deadline_s: float | None) -> float:
    """Seconds this request may wait: the client's read timeout less a margin (5 %, at least
    half a second), within the kind's deadline."""
    budget = deadline_s if deadline_s is not None else math.inf
    try:
        timeout = float(headers.get(READ_TIMEOUT, "inf"))
    except ValueError:
        timeout = math.inf
    if math.isfinite(timeout) and timeout > 0:
        budget = min(budget, timeout - max(0.5, 0.05 * timeout))
    return max(0.0, budget)


def is_retry(headers: Mapping[str, str]) -> bool:
    """The official SDKs count their own retries of a request (``X-Stainless-Retry-Count``):
    a retry asks for the answer the first try would have had, not for a new sample."""
    return headers.get(RETRY_COUNT, "0").strip() not in ("", "0")


async def submit_call(
    state: ApiState,
    tenant: str,
    kind: str,
    body: dict[str, Any],
    key: str | None,
    *,
    retry: bool = False,
    lane: Lane = Lane.INTERACTIVE,
) -> Task:
    """Submit in the interactive lane; past the tenant's ``interactive_depth`` the call goes
    in the background lane instead of being refused: a client waiting on twenty calls at once
    gets twenty answers, the first few ahead of batch work. The request key's promise (the
    hash of what was asked) is the same in either lane, so a replay finds the task. A
    ``retry`` of a sampled request takes a finished identical result (see KindSpec.replays)."""
    request = SubmitRequest(kind, body, lane=lane, key=key, replay=True if retry else None)
    (submitted,) = await state.fw.runtime.submit(
        [request], tenant=tenant, gate=state.gate, overflow=True
    )
    return submitted.task


async def await_call(state: ApiState, task: Task, budget_s: float) -> JSONResponse:
    """The provider's answer, a failure in OpenAI's error shape, or the deadline's 429."""
    fw = state.fw
    give_up = fw.clock.now() + budget_s
    while True:
        left = give_up - fw.clock.now()
        try:
            done = await fw.wait(
                task.id, timeout=max(0.0, min(left, LOOK_EVERY_S)), tenant=task.tenant
            )
        except WaitTimeout:
            task = await fw.get(task.id, tenant=task.tenant)
            next_at = task.next_attempt_at if task.status is Status.RETRYING else None
            if fw.clock.now() >= give_up or (next_at is not None and next_at >= give_up):
                await _too_late(state, task, budget_s)
            continue
        return await _answer(state, done)


async def _answer(state: ApiState, task: Task) -> JSONResponse:
    resource = state.fw.runtime.kinds.get(task.kind).resource
    headers = {**task_headers(task.id, task.upstream_request_id),
               **(await rate_headers(state, resource))}  # fmt: skip
    if task.status is Status.SUCCEEDED:
        if task.finished_at is not None:
            durations = state.call_durations.setdefault(task.kind, JobDurations(quantile=0.5))
            durations.record(task.created_at, task.finished_at)
        return JSONResponse(printable(task.result), headers=headers)
    if task.status is Status.DEDUPED:
        return JSONResponse(printable(task.result), headers=headers)
    raise failure(task, headers)


def failure(task: Task, headers: dict[str, str] | None = None) -> ApiProblem:
    """A task that ended without a result, as the problem the client gets."""
    failed = task_failure(task)
    return ApiProblem(
        failed.status,
        failed.slug,
        failed.message,
        headers=headers,
        task_id=task.id,
        code=failed.code or failed.slug,
    )


async def _too_late(state: ApiState, task: Task, budget_s: float) -> NoReturn:
    fw = state.fw
    now = fw.clock.now()
    durations = state.call_durations.get(task.kind)
    typical = (durations.leave_alone_s() if durations else None) or FIRST_GUESS_S
    next_at = task.next_attempt_at if task.status is Status.RETRYING else None
    retry_after = max(0.0, (next_at or now) - now) + typical
    if task.request_key is None and task.fingerprint is None:
        # Nobody could ever collect this result: do not pay for it.
        await fw.cancel(task.id, tenant=task.tenant)
    raise ApiProblem(
        429,
        "deadline-would-pass",
        f"the call is still {task.status.value} and would not end within this request's "
        f"{budget_s:.1f} s (X-Stainless-Read-Timeout, less a margin, or the kind's deadline); "
        f"floodway keeps working on it: send the same request again in {retry_after:.1f} s",
        # retry-after-ms as OpenAI sends it (the SDKs prefer it), Retry-After for the rest
        headers={
            "Retry-After": retry_after_header(retry_after),
            "retry-after-ms": str(math.ceil(1000 * retry_after)),
            TASK_HEADER: task.id,
        },
        task_id=task.id,
        retry_after=retry_after,
    )
