"""Time, injectable, and the asyncio idioms that wait on it.

The engine reads the time only through a :class:`Clock`, and passes ``now`` into every store
query, so tests drive time with :class:`floodway.testing.FakeClock`. Two idioms are written once
here too: stopping a background task, and waiting on an event with a timeout, both safe against
the cancellation corner cases of Python 3.11's own helpers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


async def wait_event(clock: Clock, event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass on ``clock``; True if set."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    sleeper = asyncio.ensure_future(clock.sleep(timeout))
    try:
        await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        sleeper.cancel()
    return event.is_set()


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has ended. Its cancellation is not the caller's: only
    an error it ended with is raised here, and a cancellation of the caller still is."""
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.result()


async def event_set_within(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` real seconds for ``event``; True if it was set.

    Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancellation that arrives as the
    event is set, and a loop built on it then never stops.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, timeout)):
            await event.wait()
    return event.is_set()
