"""Run one claimed task's handler and turn whatever happens into an :data:`Outcome`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

import jsonschema

from floodway.clock import Clock
from floodway.context import Context
from floodway.core import changes
from floodway.core.errors import InvalidOutput
from floodway.core.outcome import Cancelled, Failed, Outcome, Parked, Succeeded
from floodway.core.retry import UNEXPECTED, RetryPolicy
from floodway.core.task import JSON, ErrorClass, ErrorInfo
from floodway.kinds import KindSpec

log = logging.getLogger("floodway.worker")


async def execute(spec: KindSpec, ctx: Context, policy: RetryPolicy, clock: Clock) -> Outcome:
    """Never raises (but CancelledError when the worker itself is being torn down).

    A call may take the kind's timeout: past it, the outcome says floodway hung up, and the
    worker asks the hang-up rule (``core/hangup.py``) what follows. It is not cut at the task's
    deadline nor by a cancel: the provider would go on (and bill) all the same, so those end
    the task while the call is read to its end, and a late success is kept for the work."""
    if ctx.deadline_at is not None and clock.now() >= ctx.deadline_at:
        return _deadline_outcome(ctx)  # claimed past its deadline: no call at all
    run = asyncio.ensure_future(spec.handler(ctx, ctx.task.input))
    watches: set[asyncio.Future[Any]] = {asyncio.ensure_future(ctx.lease_lost.wait())}
    if spec.timeout_s is not None:  # on the clock: the timeout is the kind's, in its time
        watches.add(asyncio.ensure_future(clock.sleep(spec.timeout_s)))
    try:
        await asyncio.wait({run, *watches}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        run.cancel()
        raise
    finally:
        for watch in watches:
            watch.cancel()
    if not run.done():
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await run
        if ctx.lease_lost.is_set():  # fenced: another worker holds the task now
            return Cancelled("lease lost")
        message = f"handler ran longer than {spec.timeout_s}s"
        return Failed(ErrorInfo(ErrorClass.RETRYABLE, "timeout", message), hung_up=True)
    try:
        result = run.result()
    except asyncio.CancelledError:
        return Cancelled("handler cancelled")
    except Exception as exc:
        failed = policy.classify(exc)
        if failed.error.type == UNEXPECTED:  # floodway's own errors say what happened
            log.error(
                "task %s (kind %s, attempt %d): the handler raised %s; retried within max_attempts",
                ctx.task.id,
                spec.name,
                ctx.task.attempts,
                type(exc).__name__,
                exc_info=exc,
            )
        return dataclasses.replace(failed, usage=ctx.usage)
    if isinstance(result, Parked):
        return result  # an upstream job: its result is checked when the job ends
    return checked_result(spec, policy, result, ctx.usage)


def checked_result(
    spec: KindSpec, policy: RetryPolicy, result: JSON, usage: float | None
) -> Succeeded | Failed:
    """A handler's (or a polled upstream job's) result against the kind's output schema: an
    invalid output counts toward poison."""
    if spec.output_schema is not None:
        try:
            jsonschema.validate(result, spec.output_schema)
        except jsonschema.ValidationError as exc:
            failed = policy.classify(InvalidOutput(f"output fails the schema: {exc.message}"))
            return Failed(failed.error, usage=usage)
    return Succeeded(result, usage)


def _deadline_outcome(ctx: Context) -> Failed:
    return Failed(changes.DEADLINE_PASSED, usage=ctx.usage)
