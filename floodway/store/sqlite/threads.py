"""SQLite connections on their own threads, so the event loop never blocks on a lock.

A :class:`ConnectionThread` owns one connection and runs batches of jobs on it: the writer
hands each batch to the group commit (every write waiting when a transaction starts joins it),
the reader runs one read at a time. Results go back to each job's event loop in one wake-up
per batch, not one per job. Jobs marked to go first (the writer's claims: a provider slot idles
until its claim lands) run as a batch of their own ahead of the others waiting with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

J = TypeVar("J")
#: A batch runner: every job's outcome (value or error), in order.
RunBatch = Callable[[sqlite3.Connection, Sequence[J]], list[tuple[Any, BaseException | None]]]
_Job = tuple[J, asyncio.Future[Any], asyncio.AbstractEventLoop]

_STOP = object()


class ConnectionThread(Generic[J]):
    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        name: str,
        run_batch: RunBatch[J],
        max_batch: int = 1,
        first: Callable[[J], bool] | None = None,
    ) -> None:
        self._connect = connect
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._first = first
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            raise self._open_error

    def stop(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(_STOP)
            self._thread.join()

    async def run(self, job: J) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._jobs.put((job, fut, loop))
        return await fut

    def _main(self) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:  # reported to start()
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while (batch := self._next_batch()) is not None:
                for part in self._split(batch):
                    self._run(conn, part)
        finally:
            conn.close()

    def _split(self, batch: list[_Job[J]]) -> list[list[_Job[J]]]:
        if self._first is None:
            return [batch]
        first: list[_Job[J]] = []
        rest: list[_Job[J]] = []
        for job in batch:
            (first if self._first(job[0]) else rest).append(job)
        return [part for part in (first, rest) if part]

    def _run(self, conn: sqlite3.Connection, batch: list[_Job[J]]) -> None:
        try:
            outcomes = self._run_batch(conn, [job for job, _, _ in batch])
        except BaseException as exc:  # the batch as a whole failed (COMMIT, disk)
            _roll_back(conn)
            outcomes = [(None, exc)] * len(batch)
        _deliver(batch, outcomes)

    def _next_batch(self) -> list[_Job[J]] | None:
        first = self._jobs.get()
        if first is _STOP:
            return None
        batch: list[_Job[J]] = [first]
        while len(batch) < self._max_batch:
            try:
                nxt = self._jobs.get_nowait()
            except queue.Empty:
                break
            if nxt is _STOP:
                self._jobs.put(_STOP)
                break
            batch.append(nxt)
        return batch


def _roll_back(conn: sqlite3.Connection) -> None:
    """What is left of a failed transaction, undone. A rollback that fails too (the disk
    still full) must not end the thread every later job waits on."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.rollback()


def _deliver(batch: Sequence[_Job[Any]], outcomes: list[tuple[Any, BaseException | None]]) -> None:
    """One wake-up of each waiting loop per batch, not one per job."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, Any]]] = {}
    for (_job, fut, loop), (result, error) in zip(batch, outcomes, strict=True):
        by_loop.setdefault(loop, []).append((fut, result, error))
    for loop, results in by_loop.items():
        loop.call_soon_threadsafe(_settle, results)


def _settle(results: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, result, error in results:
        if fut.cancelled():
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)


class Checkpointer:
    """Copies the WAL back into the database every ``every_s`` on a connection of its own
    (``PRAGMA wal_checkpoint(PASSIVE)``: it waits for no reader or writer, and copies what no
    reader still needs), so that no commit has to."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], every_s: float) -> None:
        self._connect = connect
        self._every_s = every_s
        self._stop = threading.Event()
        self._conn: sqlite3.Connection | None = None
        self._thread = threading.Thread(target=self._main, name="floodway-sqlite-checkpoint")
        self._thread.daemon = True

    def start(self) -> None:
        self._conn = self._connect()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._conn is not None:
            self._conn.close()

    def checkpoint(self) -> tuple[int, int, int]:
        """One passive checkpoint: (busy, frames in the WAL, frames copied)."""
        assert self._conn is not None, "started"
        busy, frames, copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(busy), int(frames), int(copied)

    def _main(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self.checkpoint()
            except sqlite3.Error:  # busy or locked now: the next round copies it
                continue
