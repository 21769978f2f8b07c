"""The fleet ledger: PostgreSQL behind a connection pool, the same rules as SQLite.

Connections: one pool (autocommit; each commit group opens one explicit transaction) plus one
dedicated connection that LISTENs for other processes' writes and holds this process's
liveness lock (:mod:`.listen`).

Group commit: the writes waiting when a transaction starts share it (at most two transactions
commit at once), so a burst of submits or completions pays for one commit, not hundreds; a
group's submits also share one INSERT. A deadlock runs the whole group again; any other error
fails only its own write. The COMMIT carries the NOTIFY in the same round trip.

Surviving a server restart: a connection the restart broke fails the first command a call
sends on it (a read's query, a group's BEGIN), before anything was written; the pool drops it
and the call tries the next connection, so broken connections are replaced instead of failing
the call (checking each connection before lending it would cost every call a round trip). A
call made while the server is down waits up to ``timeout_s`` for a connection, then raises
:class:`StoreError`. The listening connection reconnects by itself with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from floodway.core.errors import ConfigError, InvalidInput, StoreError
from floodway.store.drive import drive_async
from floodway.store.factory import redact
from floodway.store.group import Write, Written, commit_group
from floodway.store.ledger import Ledger
from floodway.store.postgres.listen import ChangeFeed, FeedReader, listen
from floodway.store.postgres.sql import MIGRATIONS, Conn, Q
from floodway.store.steps import LIST_TYPES, Ask, Query, Step, Tx, count

T = TypeVar("T")
Pool = AsyncConnectionPool[Conn]

log = logging.getLogger(__name__)

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: Failures that only mean "another writer got there first": the group runs again.
_RETRYABLE = (pgerrors.DeadlockDetected, pgerrors.SerializationFailure)
_WRITE_TRIES = 3
_TX = {
    Tx.BEGIN: "BEGIN",
    Tx.COMMIT: "COMMIT",
    # Simple query protocol: the NOTIFY and the COMMIT travel together.
    Tx.COMMIT_NOTIFY: f"{Q['notify_changes']}; COMMIT",
    Tx.ROLLBACK: "ROLLBACK",
    Tx.SAVEPOINT: "SAVEPOINT write",
    Tx.RELEASE: "RELEASE SAVEPOINT write",
    Tx.ROLLBACK_TO: "ROLLBACK TO SAVEPOINT write",
}
#: writes that share one transaction at most, and transactions committing at once
_GROUP_MAX = 256
_FLUSHERS = 2


@dataclass
class _Pending:
    write: Write
    done: asyncio.Future[Written]


class PostgresStore(Ledger):
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
            raise ConfigError(f"bad schema name {schema!r}: use letters, digits and _")
        super().__init__(url)
        self.schema = schema
        self._safe_url = redact(url)
        self._min_size, self._max_size, self._timeout_s = min_size, max_size, timeout_s
        self._kwargs = self._connect_kwargs(url, schema)
        self._queued: list[_Pending] = []
        self._flushers: set[asyncio.Task[None]] = set()
        self._pool: Pool | None = None
        self._feed: ChangeFeed | None = None

    def _connect_kwargs(self, url: str, schema: str | None) -> dict[str, Any]:
        try:
            options = conninfo_to_dict(url).get("options")
        except psycopg.Error as exc:
            raise ConfigError(f"bad PostgreSQL URL {self._safe_url}: {exc}") from exc
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
            await _migrate(first, self.schema)
            cur = await first.execute(Q["current_schema"])
            row = await cur.fetchone()
            await listen(first, self.identity)
            pool = await self._open_pool()
        except (psycopg.Error, StoreError) as exc:
            await first.close()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"cannot migrate {self._safe_url}: {exc}") from exc
        schema = str(row["name"] if row else "")
        self._feed = ChangeFeed(first, self._connect, schema, self.identity)
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

    def _require_pool(self) -> Pool:
        if self._pool is None:
            raise StoreError("store is not open")
        return self._pool

    async def wait_for_change(self, timeout: float) -> bool:
        if self._feed is None:
            raise StoreError("store is not open")
        return await self._feed.wait(timeout)

    def subscribe(self) -> FeedReader:
        if self._feed is None:
            raise StoreError("store is not open")
        return self._feed.subscribe()

    async def server_time(self) -> float | None:
        row = await self._one("server_time")
        assert row is not None  # one row, always
        return float(row["now"])

    # -- the two primitives of the ledger --------------------------------------------------
    async def _fetch(self, query: Query) -> Any:
        pool = self._require_pool()  # the one lent from: a pool closed meanwhile closes conn
        try:
            conn, value = await self._lend(lambda c: _execute(c, query))
        except psycopg.Error as exc:
            raise self._error(exc) from exc
        await pool.putconn(conn)
        return value

    async def _commit(self, write: Write) -> Written:
        self._require_pool()
        done: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
        self._queued.append(_Pending(write, done))
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

    async def _commit_group(self, group: list[_Pending]) -> None:
        writes = [p.write for p in group]
        for attempt in range(1, _WRITE_TRIES + 1):
            try:
                written = await self._run_group(writes)
            except _RETRYABLE as exc:
                if attempt < _WRITE_TRIES:
                    continue
                self._fail(group, self._error(exc))
                return
            except psycopg.Error as exc:
                self._fail(group, self._error(exc))
                return
            except BaseException as exc:
                self._fail(group, exc)
                raise
            break
        for pending, done in zip(group, written, strict=True):
            if isinstance(done.error, psycopg.Error):
                done.error = self._error(done.error)
            if not pending.done.done():
                pending.done.set_result(done)

    async def _run_group(self, writes: list[Write]) -> list[Written]:
        # The group's BEGIN is the first command on the lent connection (see _lend). The
        # connection goes back to the pool it came from: closed meanwhile, that closes it,
        # and the group's outcome stands.
        pool = self._require_pool()
        conn, _ = await self._lend(lambda c: c.execute(_TX[Tx.BEGIN], prepare=False))
        began = True

        async def execute(step: Step) -> Any:
            nonlocal began
            if step is Tx.BEGIN and began:
                began = False
                return None
            return await _execute(conn, step)

        def aborts(exc: Exception) -> bool:
            return isinstance(exc, _RETRYABLE) or conn.broken

        try:
            return await drive_async(commit_group(writes), execute, aborts)
        except BaseException:
            if not conn.broken:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK", prepare=False)
            raise
        finally:
            await pool.putconn(conn)

    async def _lend(self, first: Callable[[Conn], Awaitable[T]]) -> tuple[Conn, T]:
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

    @staticmethod
    def _fail(group: list[_Pending], error: BaseException) -> None:
        for pending in group:
            if not pending.done.done():
                pending.done.set_exception(error)

    def _error(self, exc: psycopg.Error) -> Exception:
        """What a driver error means to the caller. A value the database cannot store (a
        NUL character in text) is the caller's bad input, not an outage."""
        if isinstance(exc, psycopg.DataError):
            return InvalidInput(f"a value PostgreSQL cannot store: {exc}")
        return StoreError(f"{self._safe_url}: {exc}")

    # -- liveness: a session lock on the listening connection (see .listen) ----------------
    async def dead(self, identities: Sequence[str]) -> set[str]:
        if not identities:
            return set()
        rows = await self._all("dead_processes", identities=tuple(identities))
        return {r["identity"] for r in rows}

    async def forget(self, identity: str) -> None:
        await self._drop_leases(identity)
        await self._write(lambda _: count("forget_process", identity=identity))


async def _execute(conn: Conn, step: Step) -> Any:
    if isinstance(step, Tx):
        await conn.execute(_TX[step], prepare=False)
        return None
    if isinstance(step, Ask):
        return True  # data-modifying CTEs
    if step.shape == "each":
        async with conn.cursor() as cur:
            await cur.executemany(Q[step.name], step.params["rows"])
        return None
    cur = await conn.execute(Q[step.name], _bind(step.params))
    if step.shape == "one":
        return await cur.fetchone()
    if step.shape == "all":
        return await cur.fetchall()
    return cur.rowcount


def _bind(params: Mapping[str, Any]) -> dict[str, Any]:
    """Rows (a list of dicts) go as one JSON text to ``json_to_recordset``; other lists as
    arrays."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, LIST_TYPES):
            value = _records(value) if value and isinstance(value[0], dict) else list(value)
        out[key] = value
    return out


def _records(rows: Sequence[Mapping[str, Any]]) -> str:
    try:
        return json.dumps(rows, separators=(",", ":"), allow_nan=False)
    except ValueError:  # inf and nan are not JSON; double precision reads them from strings
        return json.dumps([{k: _finite(v) for k, v in r.items()} for r in rows])


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


async def _migrate(conn: Conn, schema: str | None) -> None:
    """Create ``schema`` if asked, then apply the pending migrations, all under one lock."""
    async with conn.transaction():
        await conn.execute(Q["migrations_lock"])
        if schema is not None:
            await conn.execute(
                pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema))
            )
        await conn.execute(Q["migrations_table"])
        cur = await conn.execute(Q["migrations_applied"])
        done = {r["version"] for r in await cur.fetchall()}
        for version, name, text in MIGRATIONS:
            if version not in done:
                # No parameters: psycopg sends the file's statements as one simple query.
                await conn.execute(text)
                await conn.execute(Q["migration_done"], {"version": version, "name": name})
