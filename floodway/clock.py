"""Time, injectable, and the asyncio idioms that wait on it.

The engine reads the time only through a :class:`Clock`, and passes ``now`` into every store
query, so tests drive time with :class:`floodway.testing.FakeClock`. Two idioms are written once
here too: stopping a background task, and waiting on an event with a timeout, both safe against
the cancellation corner cases of Python 3.11's own helpers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

log = logging.getLogger("floodway.clock")


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


#: the ledger server's time, or None when the ledger shares this host's clock
ServerTime = Callable[[], Awaitable[float | None]]

#: how often a :class:`LedgerClock` reads the ledger's clock again: a host clock drifts some
#: milliseconds a minute, and a step of it (NTP, an operator) is caught up with within this
ALIGN_EVERY_S = 30.0
#: readings per alignment; the one with the shortest round trip is kept
ALIGN_READINGS = 3
#: an offset that moves this much is logged: a host clock this far off wants fixing
_NOTABLE_S = 1.0


class LedgerClock:
    """The ledger server's time, read through this host's clock and an offset to it.

    The processes of a fleet compare times each of them wrote (when a task is due, when a
    lease or a deadline ends, which budget period a charge falls in). On their own hosts'
    clocks, a task submitted through a process 10 s ahead would wait 10 s for every worker.
    Set by the ledger's clock, any two processes' times differ by at most half the round trip
    of their last readings plus what their host clocks drifted since (at most
    ``ALIGN_EVERY_S`` ago). A ledger on this host (SQLite) shares its clock: no offset."""

    def __init__(self, base: Clock | None = None) -> None:
        self.base: Clock = base or SystemClock()
        #: seconds added to the host's clock
        self.offset = 0.0
        #: the error bound of ``offset``: half the round trip of its reading (None: not read)
        self.error: float | None = None
        self._follower: asyncio.Task[None] | None = None

    def now(self) -> float:
        return self.base.now() + self.offset

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)

    async def align(self, server_time: ServerTime) -> None:
        """Read the ledger's clock a few times; keep the reading of the shortest round trip,
        taken to be read halfway through it."""
        best: tuple[float, float] | None = None  # (half the round trip, offset)
        for _ in range(ALIGN_READINGS):
            sent = self.base.now()
            server = await server_time()
            half = (self.base.now() - sent) / 2
            if server is None:
                return
            if best is None or half < best[0]:
                best = (half, server - (sent + half))
        assert best is not None
        half, offset = best
        if abs(offset - self.offset) >= _NOTABLE_S:
            log.warning(
                "this host's clock is %.3f s %s the ledger's (within %.3f s): floodway keeps "
                "the ledger's time",
                abs(offset),
                "behind" if offset > 0 else "ahead of",
                half,
            )
        self.offset, self.error = offset, half

    async def follow(self, server_time: ServerTime) -> None:
        """Align now, then every ``ALIGN_EVERY_S`` until :meth:`unfollow`."""
        await self.align(server_time)
        if self.error is not None and self._follower is None:
            self._follower = asyncio.create_task(self._follow(server_time), name="floodway-clock")

    async def unfollow(self) -> None:
        await stop_task(self._follower)
        self._follower = None

    async def _follow(self, server_time: ServerTime) -> None:
        while True:
            await self.base.sleep(ALIGN_EVERY_S)
            try:
                await self.align(server_time)
            except Exception as exc:  # the ledger is down: the last offset stays good for long
                log.warning("could not read the ledger's clock (%s); keeping the last offset", exc)


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
