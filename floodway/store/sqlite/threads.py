"""SQLite connections on their own threads, so the event loop never blocks on a lock.

The writer thread commits in groups: every write that is waiting when a transaction starts
joins it. Under load this turns hundreds of small transactions into a few large ones. A write
that fails does not undo the others: the group then runs again with a savepoint per write.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
Op = Callable[[sqlite3.Connection], Any]
_Job = tuple[Op, asyncio.Future[Any], asyncio.AbstractEventLoop]

_STOP = object()


def _deliver(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.cancelled():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class ConnectionThread:
    """One connection, one thread. ``group`` = run queued ops in one shared transaction."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        name: str,
        group: bool,
        max_group: int = 512,
    ) -> None:
        self._connect = connect
        self._group = group
        self._max_group = max_group
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

    async def run(self, op: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._jobs.put((op, fut, loop))
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
            while True:
                first = self._jobs.get()
                if first is _STOP:
                    return
                batch: list[_Job] = [first]
                if self._group:
                    while len(batch) < self._max_group:
                        try:
                            nxt = self._jobs.get_nowait()
                        except queue.Empty:
                            break
                        if nxt is _STOP:
                            self._jobs.put(_STOP)
                            break
                        batch.append(nxt)
                    self._run_group(conn, batch)
                else:
                    self._run_single(conn, batch[0])
        finally:
            conn.close()

    @staticmethod
    def _run_single(conn: sqlite3.Connection, job: _Job) -> None:
        op, fut, loop = job
        try:
            result, error = op(conn), None
        except BaseException as exc:
            result, error = None, exc
        loop.call_soon_threadsafe(_deliver, fut, result, error)

    @staticmethod
    def _run_group(conn: sqlite3.Connection, batch: list[_Job]) -> None:
        # Optimistic first: no savepoints (two statements less per op). An op that fails
        # rolls the group back and the group runs again, each op in a savepoint; an op alone
        # in its group needs neither: the rollback undid just that op. Ops only touch the
        # database, so running one again after a rollback is safe.
        outcomes = _run_ops(conn, batch, isolate=False) or _run_ops(conn, batch, isolate=True)
        assert outcomes is not None  # an isolated run always has them
        # One wake-up of each waiting loop per group, not one per op.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, Any]]] = {}
        for (_op, fut, loop), (result, error) in zip(batch, outcomes, strict=True):
            by_loop.setdefault(loop, []).append((fut, result, error))
        for loop, results in by_loop.items():
            loop.call_soon_threadsafe(_deliver_all, results)


def _deliver_all(results: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, result, error in results:
        _deliver(fut, result, error)


def _run_ops(
    conn: sqlite3.Connection, batch: list[_Job], isolate: bool
) -> list[tuple[Any, BaseException | None]] | None:
    """Run the group in one transaction. Not isolated, the first failing op rolls back the
    whole group and the answer is None (unless it is alone: then that is its outcome)."""
    outcomes: list[tuple[Any, BaseException | None]] = []
    try:
        conn.execute("BEGIN IMMEDIATE")
        for op, _fut, _loop in batch:
            if not isolate:
                try:
                    outcomes.append((op(conn), None))
                except Exception as exc:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    return [(None, exc)] if len(batch) == 1 else None
                continue
            conn.execute("SAVEPOINT op")
            try:
                outcomes.append((op(conn), None))
                conn.execute("RELEASE op")
            except Exception as exc:
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
                outcomes.append((None, exc))
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        return [(None, exc)] * len(batch)
    return outcomes
