"""Run one claimed task's handler and turn whatever happens into an :data:`Outcome`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

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

    A call may take the kind's timeout. It is not cut at the task's deadline: the provider
    would go on (and bill) all the same, so the deadline ends the task (the sweeper writes
    ``timeout``) while the call ends on its own, and a late success is kept for the work."""
    if ctx.deadline_at is not None and clock.now() >= ctx.deadline_at:
        return _deadline_outcome(ctx)  # claimed past its deadline: no call at all
    budget = spec.timeout_s
    run = asyncio.ensure_future(spec.handler(ctx, ctx.task.input))
    cancel_watch = asyncio.ensure_future(ctx.cancelled.wait())
    try:
        done, _ = await asyncio.wait(
            {run, cancel_watch}, timeout=budget, return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:
        run.cancel()
        cancel_watch.cancel()
        raise
    cancel_watch.cancel()
    if run not in done:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await run
        if ctx.cancelled.is_set():
            return Cancelled("cancelled while running")
        if ctx.deadline_at is not None and clock.now() >= ctx.deadline_at:
            return _deadline_outcome(ctx)
        return Failed(
            ErrorInfo(
                ErrorClass.RETRYABLE, "timeout", f"handler ran longer than {spec.timeout_s}s"
            ),
            usage=ctx.usage,
        )
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
