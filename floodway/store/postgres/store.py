"""The fleet ledger: PostgreSQL behind a connection pool, with the SQLite store's semantics.

Connections: one pool (autocommit; each write opens one explicit transaction) plus one
dedicated connection that LISTENs for other processes' writes (:mod:`.listen`).

Surviving a server restart: a connection the restart broke fails the first command a call
sends on it (a read's query, a write's BEGIN), before anything was written; the pool drops it
and the call tries the next connection, so broken connections are replaced instead of failing
the call (checking each connection before lending it would cost every call a round trip). A
call made while the server is down waits up to ``timeout_s`` for a connection, then raises
:class:`StoreError`. The listening connection reconnects by itself with backoff and reports a
change when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from floodway.core.errors import IllegalTransition, StoreError
from floodway.core.outcome import Applied, Completion
from floodway.core.states import CLAIMABLE, Status, check_transition
from floodway.core.task import NewTask, Submitted, Task
from floodway.store.base import (
    Candidate,
    ChangeListener,
    ClaimParams,
    HeartbeatResult,
    Purged,
    ReadyQuery,
    Retention,
    StoreStats,
    TaskChange,
    TaskEvent,
    TaskQuery,
)
from floodway.store.postgres import ledger
from floodway.store.postgres.listen import ChangeFeed
from floodway.store.postgres.sql import Conn, Q, many, one, run
from floodway.store.rows import (
    candidate_from_row,
    claim_args,
    list_params,
    list_query,
    park_params,
    task_from_row,
)

T = TypeVar("T")
Pool = AsyncConnectionPool[Conn]
ReadOp = Callable[[Conn], Awaitable[T]]
WriteOp = Callable[[Conn, list[TaskChange]], Awaitable[T]]
#: a write's value, its error, and the changes it made
Outcome = tuple[Any, BaseException | None, list[TaskChange]]

log = logging.getLogger(__name__)

for _state in CLAIMABLE:  # the claim queries move these to running: keep them in the table
    check_transition(_state, Status.RUNNING)

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: Failures that only mean "another writer got there first": the transaction is re-run.
_RETRYABLE = (pgerrors.DeadlockDetected, pgerrors.SerializationFailure)
_WRITE_TRIES = 3
#: A write's transaction ends in one round trip, telling the listeners on the way (simple
#: query protocol: the statements travel together).
_COMMIT = "COMMIT"
_NOTIFY_AND_COMMIT = f"{Q['notify_changes']}; COMMIT"
#: writes that share one transaction at most, and transactions committing at once
_GROUP_MAX = 256
_FLUSHERS = 2


class _OneWriteFailed(Exception):
    """A write of an optimistic group failed: run the group again with savepoints."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


@dataclass
class _PendingWrite:
    op: WriteOp[Any]
    wake: bool
    done: asyncio.Future[Any]
    #: a submit (tasks, now) whose tasks may share one INSERT with the group's other such
    #: submits; ``op`` writes the same alone
    merge: tuple[Sequence[NewTask], float] | None = None


def _wakes(changes: Sequence[TaskChange]) -> bool:
    """Whether other processes' dispatchers should hear of these changes (the NOTIFY is only
    for them). A task that became running (a claim, a park) brings them no work and frees no
    provider slot; every other change may: new or requeued work, or a finished task's slot.
    In F1 the claims' notices were half of all wake-ups, each one a wasted pass."""
    return any(c.status is not Status.RUNNING for c in changes)


def _submit_changes(results: list[Submitted]) -> list[TaskChange]:
    return [TaskChange(s.task.id, s.task.status, s.task.tenant) for s in results if not s.reused]


def redact(url: str) -> str:
    """The URL without its password, for error messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return re.sub(r"password\s*=\s*\S+", "password=***", url)
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class PostgresStore:
    """``PostgresStore("postgresql://user@host/db")``; ``schema=`` keeps the tables in their
    own schema (created on open), e.g. one per test or per deployment sharing a database."""

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        min_size: int = 2,
        max_size: int = 10,
        timeout_s: float = 10.0,
    ) -> None:
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise StoreError(f"bad schema name {schema!r}: use letters, digits and _")
        self.url = url
        self.schema = schema
        self._safe_url = redact(url)
        self._min_size, self._max_size, self._timeout_s = min_size, max_size, timeout_s
        self._kwargs = self._connect_kwargs(url, schema)
        self._listeners: list[ChangeListener] = []
        self._queued: list[_PendingWrite] = []
        self._flushers: set[asyncio.Task[None]] = set()
        self._pool: Pool | None = None
        self._feed: ChangeFeed | None = None

    def _connect_kwargs(self, url: str, schema: str | None) -> dict[str, Any]:
        try:
            options = conninfo_to_dict(url).get("options")
        except psycopg.Error as exc:
            raise StoreError(f"bad PostgreSQL URL {self._safe_url}: {exc}") from exc
        kwargs: dict[str, Any] = {"autocommit": True, "row_factory": dict_row}
        if schema is not None:  # keep the URL's own options (statement_timeout, ...)
            kwargs["options"] = f"{options or ''} -c search_path={schema}".strip()
        return kwargs

    # -- lifecycle -----------------------------------------------------------------------
    async def _connect(self) -> Conn:
        return await psycopg.AsyncConnection.connect(
            self.url, connect_timeout=max(1, round(self._timeout_s)), **self._kwargs
        )

    async def open(self) -> None:
        if self._pool is not None:
            return
        # A direct first connection gives a clear error at once (the pool would retry
        # quietly until its timeout); it migrates, then stays on as the LISTENer.
        try:
            first = await self._connect()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to {self._safe_url}: {exc}") from exc
        try:
            await ledger.migrate(first, self.schema)
            row = await one(first, "current_schema")
            await first.execute(Q["listen_changes"])
            pool = await self._open_pool()
        except (psycopg.Error, StoreError) as exc:
            await first.close()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"cannot migrate {self._safe_url}: {exc}") from exc
        self._feed = ChangeFeed(first, self._connect, str(row["name"] if row else ""))
        self._feed.start()
        self._pool = pool

    async def _open_pool(self) -> Pool:
        pool: Pool = AsyncConnectionPool(
            self.url,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs=self._kwargs,
            min_size=self._min_size,
            max_size=self._max_size,
            timeout=self._timeout_s,
            reconnect_failed=self._reconnect_failed,
            name="floodway",
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=self._timeout_s)
        except psycopg.Error as exc:
            await pool.close()
            raise StoreError(f"cannot connect to {self._safe_url}: {exc}") from exc
        return pool

    def _reconnect_failed(self, pool: Pool) -> None:
        # The pool gave up refilling one slot; it grows again on demand once the server is
        # back, so this is worth a log line, not a crash.
        log.warning("cannot reconnect to %s for a while; will retry on demand", self._safe_url)

    async def close(self) -> None:
        feed, self._feed = self._feed, None
        pool, self._pool = self._pool, None
        if feed is not None:
            await feed.stop()
        if pool is not None:
            await pool.close()

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def _notify(self, changes: Sequence[TaskChange]) -> None:
        if changes:
            for listener in self._listeners:
                listener(changes)

    def _require_pool(self) -> Pool:
        if self._pool is None:
            raise StoreError("store is not open")
        return self._pool

    async def _read(self, op: ReadOp[T]) -> T:
        try:
            conn, value = await self._lend(op)
        except psycopg.Error as exc:
            raise StoreError(f"{self._safe_url}: {exc}") from exc
        await self._require_pool().putconn(conn)
        return value

    async def _lend(self, first: ReadOp[T]) -> tuple[Conn, T]:
        """A pooled connection, and what ``first`` (a read, or BEGIN) gave on it. A connection
        the server dropped fails ``first``, which wrote nothing: try the next one. The pool
        holds at most ``max_size``, so one more try reaches a new connection."""
        pool = self._require_pool()
        for attempt in range(self._max_size + 1):
            conn = await pool.getconn()
            try:
                return conn, await first(conn)
            except psycopg.OperationalError:
                await pool.putconn(conn)  # a broken one is discarded and replaced
                if not conn.broken or attempt == self._max_size:
                    raise
            except BaseException:
                await pool.putconn(conn)
                raise
        raise AssertionError("unreachable")

    async def _write(
        self,
        op: WriteOp[T],
        *,
        wake: bool = False,
        merge: tuple[Sequence[NewTask], float] | None = None,
    ) -> T:
        """Run ``op`` in a transaction; NOTIFY other processes if it changed a task (or
        ``wake``); then tell this process's listeners.

        Group commit: the writes waiting when a transaction starts share it, so a burst of
        submits or completions pays for one commit, not hundreds; the ``merge`` submits of a
        group also share one INSERT. A deadlock retries the whole group; any other error fails
        only its own write."""
        self._require_pool()
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queued.append(_PendingWrite(op, wake, done, merge))
        # Count live flushers only: one that has just returned may still sit in the set
        # until its done-callback runs, and it will not see this write.
        if sum(not f.done() for f in self._flushers) < _FLUSHERS:
            flusher = asyncio.create_task(self._flush(), name="floodway-pg-commit")
            self._flushers.add(flusher)
            flusher.add_done_callback(self._flushers.discard)
        return await done

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # one loop tick: let the writes issued now join
        while self._queued:
            group, self._queued = self._queued[:_GROUP_MAX], self._queued[_GROUP_MAX:]
            await self._commit_group(group)

    async def _commit_group(self, group: list[_PendingWrite]) -> None:
        # Optimistic first: no savepoints (two round trips less per write). A write that
        # fails rolls the group back and the group runs again, each write in a savepoint;
        # a write alone in its group needs neither: the rollback undid just that write.
        isolate = False
        attempt = 1
        while True:
            try:
                outcomes = await self._run_group(group, isolate)
            except _OneWriteFailed as failed:
                if len(group) == 1:
                    outcomes = [(None, failed.error, [])]
                    break
                isolate = True
                continue
            except _RETRYABLE as exc:
                if attempt < _WRITE_TRIES:
                    attempt += 1
                    continue
                self._fail_group(group, StoreError(f"{self._safe_url}: {exc}"))
                return
            except psycopg.Error as exc:
                self._fail_group(group, StoreError(f"{self._safe_url}: {exc}"))
                return
            except BaseException as exc:
                self._fail_group(group, exc)
                raise
            break
        self._notify([c for _, _, changes in outcomes for c in changes])
        for write, (value, error, _) in zip(group, outcomes, strict=True):
            if write.done.done():
                continue
            if isinstance(error, psycopg.Error):
                error = StoreError(f"{self._safe_url}: {error}")
            if error is None:
                write.done.set_result(value)
            else:
                write.done.set_exception(error)

    async def _run_group(self, group: list[_PendingWrite], isolate: bool) -> list[Outcome]:
        # BEGIN and COMMIT by hand rather than with conn.transaction(): the COMMIT then
        # shares its round trip with the NOTIFY (savepoints inside still work).
        conn, _ = await self._lend(lambda c: c.execute("BEGIN", prepare=False))
        try:
            outcomes, notify = await self._group_body(conn, group, isolate)
            await conn.execute(_NOTIFY_AND_COMMIT if notify else _COMMIT, prepare=False)
        except BaseException:
            if not conn.broken:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK", prepare=False)
            raise
        finally:
            await self._require_pool().putconn(conn)
        return outcomes

    async def _group_body(
        self, conn: Conn, group: list[_PendingWrite], isolate: bool
    ) -> tuple[list[Outcome], bool]:
        """The group's outcomes, and whether other processes should hear of them."""
        outcomes: list[Outcome] = []
        # Any order of a group's writes is one their callers could have seen (none has
        # returned yet), so the merged submits go first, together.
        merged = {} if isolate else await self._submit_merged(conn, group)
        notify = any(_wakes(changes) for _, _, changes in merged.values())
        for i, write in enumerate(group):
            if i in merged:
                outcomes.append(merged[i])
                notify = notify or write.wake
                continue
            changes: list[TaskChange] = []
            try:
                if isolate:
                    async with conn.transaction():  # a savepoint per write
                        value = await write.op(conn, changes)
                else:
                    value = await write.op(conn, changes)
            except _RETRYABLE:
                raise
            except Exception as exc:
                if not isolate:
                    raise _OneWriteFailed(exc) from exc
                outcomes.append((None, exc, []))
                continue
            outcomes.append((value, None, changes))
            notify = notify or _wakes(changes) or write.wake
        return outcomes, notify

    @staticmethod
    async def _submit_merged(conn: Conn, group: list[_PendingWrite]) -> dict[int, Outcome]:
        """The outcomes of the group's ``merge`` submits, by position, written at once."""
        merging = [(i, w.merge) for i, w in enumerate(group) if w.merge is not None]
        if not merging:
            return {}
        try:
            results = await ledger.submit_many(conn, [m for _, m in merging])
        except _RETRYABLE:
            raise
        except Exception as exc:
            raise _OneWriteFailed(exc) from exc
        return {
            i: (submitted, None, _submit_changes(submitted))
            for (i, _), submitted in zip(merging, results, strict=True)
        }

    @staticmethod
    def _fail_group(group: list[_PendingWrite], error: BaseException) -> None:
        for write in group:
            if not write.done.done():
                write.done.set_exception(error)

    async def wait_for_change(self, timeout: float) -> bool:
        if self._feed is None:
            raise StoreError("store is not open")
        return await self._feed.wait(timeout)

    # -- submit and read -----------------------------------------------------------------
    async def submit(self, new: Sequence[NewTask], now: float) -> list[Submitted]:
        merge = ledger.mergeable(new)

        async def op(conn: Conn, changes: list[TaskChange]) -> list[Submitted]:
            if merge:
                results = (await ledger.submit_many(conn, [(new, now)]))[0]
            else:
                results = [await ledger.submit_one(conn, n, now) for n in new]
            changes.extend(_submit_changes(results))
            return results

        return await self._write(op, merge=(new, now) if merge else None)

    async def get(self, task_id: str, tenant: str | None = None) -> Task | None:
        row = await self._read(lambda c: one(c, "get_task", {"id": task_id}))
        if row is None or (tenant is not None and row["tenant"] != tenant):
            return None
        return task_from_row(row)

    async def list_tasks(self, query: TaskQuery) -> list[Task]:
        params = list_params(query)
        name = list_query(query)
        rows = await self._read(lambda c: many(c, name, params))
        return [task_from_row(r) for r in rows]

    async def events(self, task_id: str, after_seq: int = 0) -> list[TaskEvent]:
        params = {"task_id": task_id, "after_seq": after_seq}
        rows = await self._read(lambda c: many(c, "list_events", params))
        return [
            TaskEvent(
                r["seq"], r["task_id"], Status(r["status"]), r["at"], r["attempt"], r["detail"]
            )
            for r in rows
        ]

    async def stats(self) -> StoreStats:
        rows = await self._read(lambda c: many(c, "stats"))
        by_status: dict[str, int] = {s.value: 0 for s in Status}
        by_kind: dict[str, dict[str, int]] = {}
        for r in rows:
            by_status[r["status"]] += r["count"]
            by_kind.setdefault(r["kind"], {})[r["status"]] = r["count"]
        return StoreStats(by_status, by_kind)

    async def batch_counts(self, batch_id: str, tenant: str | None) -> dict[str, int]:
        params = {"batch_id": batch_id, "tenant": tenant}
        rows = await self._read(lambda c: many(c, "batch_counts", params))
        return {r["status"]: r["count"] for r in rows}

    # -- the worker's hot path -------------------------------------------------------------
    async def ready(self, query: ReadyQuery) -> list[Candidate]:
        params = {"kinds": list(query.kinds), "now": query.now, "limit": query.limit}
        rows = await self._read(lambda c: many(c, "ready", params))
        return [candidate_from_row(r) for r in rows]

    async def claim(self, params: ClaimParams) -> list[Task]:
        args = claim_args(params)
        if params.ids is None:
            name = "claim_next"
            args.update(kinds=list(params.kinds), limit=params.limit)
        else:
            name = "claim_ids"
            args.update(ids=list(params.ids))

        async def op(conn: Conn, changes: list[TaskChange]) -> list[Task]:
            tasks = [task_from_row(r) for r in await many(conn, name, args)]  # events logged
            changes.extend(TaskChange(t.id, t.status, t.tenant) for t in tasks)
            return tasks

        tasks = await self._write(op)
        tasks.sort(key=lambda t: (t.lane.rank, t.seq))
        return tasks

    async def complete(self, items: Sequence[Completion], now: float) -> list[Applied]:
        for item in items:
            check_transition(item.expected, item.to)
            if item.expected is Status.RUNNING and item.lease_token is None and not item.parked:
                raise IllegalTransition(item.expected, item.to, "a running task needs its lease")

        async def op(conn: Conn, changes: list[TaskChange]) -> list[Applied]:
            return await ledger.complete_many(conn, items, now, changes)

        return await self._write(op)

    async def heartbeat(
        self, leases: Sequence[tuple[str, str]], now: float, lease_s: float
    ) -> HeartbeatResult:
        if not leases:
            return HeartbeatResult()
        params = {
            "ids": [task_id for task_id, _ in leases],
            "tokens": [token for _, token in leases],
            "now": now,
            "expires_at": now + lease_s,
        }

        async def op(conn: Conn, changes: list[TaskChange]) -> list[DictRow]:
            return await many(conn, "heartbeat", params)

        held = {r["id"]: bool(r["cancel_requested"]) for r in await self._write(op)}
        lost = tuple(task_id for task_id, _ in leases if task_id not in held)
        cancel = tuple(task_id for task_id, _ in leases if held.get(task_id))
        return HeartbeatResult(lost, cancel)

    async def set_upstream_ref(self, task_id: str, lease_token: str, ref: str, now: float) -> bool:
        params = {"id": task_id, "token": lease_token, "ref": ref, "now": now}

        async def op(conn: Conn, changes: list[TaskChange]) -> int:
            return await run(conn, "set_upstream_ref", params)

        return await self._write(op) == 1

    async def park(
        self,
        task_id: str,
        lease_token: str,
        ref: str,
        poll_at: float,
        now: float,
        *,
        polled: bool = False,
    ) -> bool:
        params = park_params(task_id, lease_token, ref, poll_at, now, polled)

        async def op(conn: Conn, changes: list[TaskChange]) -> int:
            return await run(conn, "park", params)

        # Woken: a process that sleeps until the next parked poll may need to come earlier.
        return await self._write(op, wake=True) == 1

    async def claim_parked(self, params: ClaimParams) -> list[Task]:
        args = {
            "owner": params.owner,
            "token": params.token,
            "now": params.now,
            "expires_at": params.now + params.lease_s,
            "kinds": list(params.kinds),
            "limit": params.limit,
        }

        async def op(conn: Conn, changes: list[TaskChange]) -> list[DictRow]:
            return await many(conn, "claim_parked", args)

        return [task_from_row(r) for r in await self._write(op)]

    async def next_parked_at(self) -> float | None:
        row = await self._read(lambda c: one(c, "next_parked_at"))
        return None if row is None else row["at"]

    async def find_upstream(self, kind: str, ref: str) -> Task | None:
        row = await self._read(lambda c: one(c, "find_upstream", {"kind": kind, "ref": ref}))
        return None if row is None else task_from_row(row)

    async def due_callbacks(self, now: float, limit: int) -> list[Task]:
        rows = await self._read(lambda c: many(c, "due_callbacks", {"now": now, "limit": limit}))
        return [task_from_row(r) for r in rows]

    async def callback_result(self, task_id: str, state: str, next_at: float | None) -> None:
        params = {"id": task_id, "state": state, "next_at": next_at}

        async def op(conn: Conn, changes: list[TaskChange]) -> int:
            return await run(conn, "callback_result", params)

        await self._write(op)

    # -- requests from people ------------------------------------------------------------
    async def request_cancel(self, task_id: str, tenant: str | None, now: float) -> Task:
        async def op(conn: Conn, changes: list[TaskChange]) -> Task:
            return await ledger.cancel(conn, task_id, tenant, now, changes)

        # Woken even for a running task: its worker may be in another process.
        return await self._write(op, wake=True)

    async def manual_retry(self, task_id: str, tenant: str | None, now: float) -> Task:
        async def op(conn: Conn, changes: list[TaskChange]) -> Task:
            return await ledger.manual_retry(conn, task_id, tenant, now, changes)

        return await self._write(op)

    # -- maintenance -----------------------------------------------------------------------
    async def expired_leases(self, now: float, limit: int) -> list[Task]:
        rows = await self._read(lambda c: many(c, "expired_leases", {"now": now, "limit": limit}))
        return [task_from_row(r) for r in rows]

    async def past_deadline(self, now: float, limit: int) -> list[Task]:
        rows = await self._read(lambda c: many(c, "past_deadline", {"now": now, "limit": limit}))
        return [task_from_row(r) for r in rows]

    async def purge(self, retention: Retention) -> Purged:
        results_before = retention.now - retention.result_ttl_s
        rows_before = retention.now - retention.row_ttl_s

        async def op(conn: Conn, changes: list[TaskChange]) -> Purged:
            cleared = await run(conn, "purge_results", {"before": results_before})
            await run(conn, "purge_fingerprints", {"before": results_before})
            deleted = await run(conn, "purge_rows", {"before": rows_before})
            await run(conn, "purge_events", {"before": rows_before})
            keys = await run(conn, "purge_keys", {"now": retention.now})
            return Purged(cleared, deleted, keys)

        return await self._write(op)

    async def try_lead(self, name: str, owner: str, now: float, ttl_s: float) -> bool:
        params = {"name": name, "owner": owner, "now": now, "expires_at": now + ttl_s}

        async def op(conn: Conn, changes: list[TaskChange]) -> DictRow | None:
            return await one(conn, "try_lead", params)

        return await self._write(op) is not None
