"""Hear other processes' writes: LISTEN on one dedicated connection, no polling.

Every write transaction that changes a task runs ``pg_notify('floodway_changes', schema)``;
PostgreSQL delivers it at commit to every listening connection. The feed counts the notices
for its own schema, and :meth:`ChangeFeed.wait` returns as soon as the count moves.

The same session holds this process's liveness lock (a session-level advisory lock): the
server frees it when the session ends, which is when the process dies, so the others see the
death at once. A reconnect takes the lock again and registers anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import psycopg

from floodway.clock import event_set_within, stop_task
from floodway.store.postgres.sql import Conn, Q

log = logging.getLogger(__name__)

_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 5.0


class ChangeFeed:
    """Counts notices on ``floodway_changes`` whose payload is ``schema``."""

    def __init__(
        self, conn: Conn, connect: Callable[[], Awaitable[Conn]], schema: str, identity: str
    ) -> None:
        self._conn: Conn | None = conn  # already LISTENing
        self._connect = connect
        self._schema = schema
        self._generation = 0  # notices heard so far
        self._seen = 0  # generation the last wait() reported
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._identity = identity  # whose liveness lock this session holds

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="floodway-pg-listen")

    async def stop(self, *, forget: bool = True) -> None:
        """Stop listening and close the session, which frees the liveness lock. A clean exit
        also deletes the process's row (nothing to judge); ``forget=False`` leaves it, as a
        killed process does, for peers to find dead."""
        task, self._task = self._task, None
        await stop_task(task)
        if forget and self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.execute(Q["forget_process"], {"identity": self._identity})
        await self._drop()

    async def wait(self, timeout: float) -> bool:
        """True once a notice arrived since the last call returned (at once if one did)."""
        if self._generation == self._seen and not await event_set_within(self._changed, timeout):
            return False
        self._seen = self._generation
        return True

    def subscribe(self) -> FeedReader:
        """A reader of the feed with a place of its own (from now on)."""
        return FeedReader(self)

    def _heard(self) -> None:
        self._generation += 1
        # Wake everyone waiting on the current event; later waiters get a fresh one.
        self._changed.set()
        self._changed = asyncio.Event()

    async def _run(self) -> None:
        backoff = _BACKOFF_FIRST_S
        while True:
            try:
                if self._conn is None:
                    self._conn = await self._listen()
                    backoff = _BACKOFF_FIRST_S
                    # Notices sent while we were deaf are lost: report a change, so waiters
                    # look at the ledger again rather than sleep through work.
                    self._heard()
                async for note in self._conn.notifies():
                    if note.payload == self._schema:
                        self._heard()
            except psycopg.Error as exc:
                log.warning("floodway change feed lost its connection (%s); reconnecting", exc)
                await self._drop()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)

    async def _listen(self) -> Conn:
        conn = await self._connect()
        try:
            await listen(conn, self._identity)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()


class FeedReader:
    """One reader's place in a :class:`ChangeFeed`: it hears every notice whoever else reads."""

    def __init__(self, feed: ChangeFeed) -> None:
        self._feed = feed
        self._seen = feed._generation

    async def wait(self, timeout: float) -> bool:
        """True once a notice arrived since this reader's last call returned."""
        feed = self._feed
        if feed._generation == self._seen and not await event_set_within(feed._changed, timeout):
            return False
        self._seen = feed._generation
        return True


async def listen(conn: Conn, identity: str) -> None:
    """Make ``conn`` the listening session: LISTEN, and hold ``identity``'s liveness lock
    (registered with the server's time, so a restart of the server is told apart)."""
    cur = await conn.execute(Q["lock_liveness"], {"identity": identity})
    row = await cur.fetchone()
    if row is None or not row["held"]:
        raise psycopg.OperationalError(f"the liveness lock of {identity} is held elsewhere")
    await conn.execute(Q["register_liveness"], {"identity": identity})
    await conn.execute(Q["listen_changes"])
