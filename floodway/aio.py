"""Two asyncio idioms written once: stopping a background task, and waiting on an event with a
timeout, both safe against the cancellation corner cases of Python 3.11's own helpers."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


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
