"""The embedded ledger: one SQLite file in WAL mode, one writer thread, two reader threads
(one for the reads work waits on, one for the views whose cost grows with the ledger:
:data:`SCANS`). A memory database reads on the writer's thread.

The writer thread runs the group commit (:mod:`floodway.store.group`) over every write that is
waiting when a transaction starts; the rules run inside it, synchronously. It never copies the
WAL back into the database itself (a checkpoint inline would hold every write behind it): a
third thread does, every :data:`CHECKPOINT_EVERY_S`, without blocking writers or readers.

A process's liveness is an advisory lock (``flock``) on a file of its own next to the ledger:
the kernel releases it when the process dies, however it dies, so the sweeper knows a worker
is dead at once instead of when its leases expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import sqlite3
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from floodway.core.errors import ConfigError, StoreError
from floodway.store.drive import drive
from floodway.store.group import Write, Written, commit_group
from floodway.store.ledger import Ledger
from floodway.store.queries import load_migrations, load_queries
from floodway.store.sqlite.threads import Checkpointer, ConnectionThread
from floodway.store.steps import LIST_TYPES, Ask, Query, Step, Tx

Q = load_queries("floodway.store.sqlite")
MIGRATIONS = load_migrations("floodway.store.sqlite.migrations")

_TX = {
    Tx.BEGIN: "BEGIN IMMEDIATE",
    Tx.COMMIT: "COMMIT",
    Tx.COMMIT_NOTIFY: "COMMIT",  # other processes notice through PRAGMA data_version
    Tx.ROLLBACK: "ROLLBACK",
    Tx.SAVEPOINT: "SAVEPOINT write",
    Tx.RELEASE: "RELEASE write",
    Tx.ROLLBACK_TO: "ROLLBACK TO write",
}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")
CHECKPOINT_EVERY_S = 1.0


def sqlite_path(url: str) -> tuple[str, bool]:
    """``sqlite:///rel.db`` -> ``rel.db``; ``sqlite:////abs.db`` -> ``/abs.db``;
    ``sqlite://:memory:`` -> a private shared-cache memory database. Returns (target, uri)."""
    if url in ("sqlite://:memory:", "sqlite:///:memory:", ":memory:"):
        return f"file:floodway-{uuid.uuid4().hex}?mode=memory&cache=shared", True
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise ConfigError(f"not a SQLite URL: {url!r} (use sqlite:///path/to/file.db)")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise ConfigError(f"SQLite URL {url!r} names no file")
    return path, False


#: Reads whose cost grows with the ledger: an operator's or a dashboard's view (counts over
#: every task, pages of a listing, spend over a period), which the API also samples every few
#: seconds whether anyone looks or not. They run on a connection and thread of their own: on
#: the reader's, a count over 20,000 tasks held every read queued behind it (a dispatcher's
#: listing, a waiter's look at its task) for its 15-30 ms. WAL readers do not block each other.
SCANS = frozenset(
    {
        "stats",
        "list_tasks",
        "list_tasks_desc",
        "recent_timings",
        "spend_totals",
        "spend_series",
        "list_workers",
        "worker_tasks",
        "list_batches",
        "list_openai_files",
        "list_openai_batches",
    }
)


class SqliteStore(Ledger):
    def __init__(self, url: str, *, busy_timeout_s: float = 30.0) -> None:
        super().__init__(url)
        self._target, self._uri = sqlite_path(url)
        self._busy_ms = int(busy_timeout_s * 1000)
        self._writer: ConnectionThread[Write | Query] = ConnectionThread(
            self.connect, "floodway-sqlite-writer", _commit_writes, max_batch=512, first=_goes_first
        )
        self._reader: ConnectionThread[Query] = ConnectionThread(
            self.connect, "floodway-sqlite-reader", _read_one
        )
        self._scanner: ConnectionThread[Query] = ConnectionThread(
            self.connect, "floodway-sqlite-scanner", _read_one
        )
        #: copies the WAL into the database (None: not open, or a memory database)
        self.checkpointer: Checkpointer | None = None
        self._keepalive: sqlite3.Connection | None = None
        self._data_version = -1
        self._opened = False
        self._liveness: int | None = None  # the fd whose flock says this process lives

    # -- lifecycle -----------------------------------------------------------------------
    def connect(self) -> sqlite3.Connection:
        """A new connection to the ledger, set up as the store's own are."""
        if not self._uri:
            parent = Path(self._target).expanduser().resolve().parent
            if not parent.is_dir():
                raise StoreError(f"cannot open {self.url}: directory {parent} does not exist")
        try:
            conn = sqlite3.connect(
                self._target, uri=self._uri, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            if not self._uri:
                _enable_wal(conn, self._busy_ms / 1000)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # the Checkpointer's work
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute("PRAGMA cache_size = -32000")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open {self.url}: {exc}") from exc
        return conn

    async def open(self) -> None:
        if self._opened:
            return
        if self._uri:  # a memory database lives while one connection holds it
            self._keepalive = self.connect()
        await asyncio.to_thread(self._migrate)
        await asyncio.to_thread(self._writer.start)
        if not self._uri:  # a file: its readers and a checkpointer (a memory database has no WAL)
            await asyncio.to_thread(self._reader.start)
            await asyncio.to_thread(self._scanner.start)
            self.checkpointer = Checkpointer(self.connect, CHECKPOINT_EVERY_S)
            await asyncio.to_thread(self.checkpointer.start)
        self._hold_liveness()
        self._opened = True

    def _migrate(self) -> None:
        """Apply the pending migrations in one write transaction (so processes opening the
        same new file together migrate it once)."""
        conn = self.connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            for version, name, sql in MIGRATIONS:
                if version not in done:
                    for statement in _statements(sql):
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, applied_at) "
                        "VALUES (?, ?, datetime('now'))",
                        (version, name),
                    )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot migrate {self.url}: {exc}") from exc
        finally:
            conn.close()

    async def close(self) -> None:
        if not self._opened:
            return
        self._opened = False
        self._release_liveness()
        await asyncio.to_thread(self._writer.stop)
        await asyncio.to_thread(self._reader.stop)
        await asyncio.to_thread(self._scanner.stop)
        checkpointer, self.checkpointer = self.checkpointer, None
        if checkpointer is not None:
            await asyncio.to_thread(checkpointer.stop)
        if self._keepalive is not None:
            self._keepalive.close()

    def _require_open(self) -> None:
        if not self._opened:
            raise StoreError("store is not open")

    # -- the two primitives of the ledger --------------------------------------------------
    async def _fetch(self, query: Query) -> Any:
        self._require_open()
        try:
            return await self._reader_of(query).run(query)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _reader_of(self, query: Query) -> ConnectionThread[Query] | ConnectionThread[Write | Query]:
        """The thread a read runs on. A memory database's connections share one cache, whose
        table locks a reader and the writer would trip on ("database table is locked"):
        there, every read runs on the writer's connection, behind the writes."""
        if self._uri:
            return self._writer
        return self._scanner if query.name in SCANS else self._reader

    async def _commit(self, write: Write) -> Written:
        self._require_open()
        try:
            done: Written = await self._writer.run(write)
        except sqlite3.Error as exc:  # the group as a whole failed: its COMMIT, on a full disk
            raise self._error(exc) from exc
        if isinstance(done.error, sqlite3.Error):
            done.error = self._error(done.error)
        return done

    async def _version(self) -> int:
        """``PRAGMA data_version`` of the writing connection: a cheap read that changes when
        another connection commits, and only then. This process's own writes are not among
        them (its listeners hear of those at once): read on the reader's connection, every
        commit of the writer's woke each waiter for nothing, and a dispatcher so woken tried
        another claim for each claim and each outcome it wrote."""
        self._require_open()
        try:
            row = await self._writer.run(Query("data_version", {}, "one"))
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        return int(row[0])

    def _error(self, exc: sqlite3.Error) -> StoreError:
        """Every error of the database (full, read-only, I/O, locked past the busy timeout)
        is the ledger being unavailable: nothing was written, the same call may succeed
        later."""
        return StoreError(f"{self.url}: {exc}")

    async def wait_for_change(self, timeout: float) -> bool:
        """Watch the ledger's version every 20 ms, so submits from other processes are seen
        without hammering."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            version = await self._version()
            if self._data_version == -1:
                self._data_version = version
            elif version != self._data_version:
                self._data_version = version
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(0.02, left))

    def subscribe(self) -> VersionReader:
        return VersionReader(self)

    async def server_time(self) -> float | None:
        return None  # the file is on this host: its clock is ours

    # -- liveness: a lock file per process, next to the ledger -------------------------------
    def _lock_path(self, identity: str) -> Path | None:
        if self._uri:
            return None  # a memory database lives in one process: nobody else to tell
        base = Path(self._target).expanduser().resolve()
        return base.with_name(base.name + ".owners") / (_SAFE_NAME.sub("_", identity) + ".lock")

    def _hold_liveness(self) -> None:
        path = self._lock_path(self.identity)
        if path is None:
            return
        path.parent.mkdir(exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh identity: always free
        self._liveness = fd

    def _release_liveness(self) -> None:
        fd, self._liveness = self._liveness, None
        if fd is None:
            return
        path = self._lock_path(self.identity)
        with contextlib.suppress(OSError):
            assert path is not None
            path.unlink()
        os.close(fd)

    async def dead(self, identities: Sequence[str]) -> set[str]:
        return {i for i in identities if i != self.identity and self._lock_free(i)}

    async def forget(self, identity: str) -> None:
        path = self._lock_path(identity)
        if path is not None and identity != self.identity and self._lock_free(identity):
            await self._drop_leases(identity)
            with contextlib.suppress(OSError):
                path.unlink()

    def _lock_free(self, identity: str) -> bool:
        """The file's lock can be taken: its process is gone. No file: never judged."""
        path = self._lock_path(identity)
        if path is None:
            return False
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # closing drops the lock we may have taken
        return True


# -- running steps on a connection ----------------------------------------------------------


def _goes_first(job: Write | Query) -> bool:
    return isinstance(job, Write) and job.first


def _commit_writes(
    conn: sqlite3.Connection, jobs: Sequence[Write | Query]
) -> list[tuple[Any, BaseException | None]]:
    """The writer thread's batch: its writes in one commit group, then its reads (the
    version probes); each job's outcome, in order."""
    writes = [job for job in jobs if isinstance(job, Write)]
    done = drive(commit_group(writes), lambda step: _execute(conn, step), _never) if writes else []
    written = iter(done)
    reads = iter(_read_one(conn, [job for job in jobs if isinstance(job, Query)]))
    return [(next(written), None) if isinstance(job, Write) else next(reads) for job in jobs]


def _read_one(
    conn: sqlite3.Connection, queries: Sequence[Query]
) -> list[tuple[Any, BaseException | None]]:
    out: list[tuple[Any, BaseException | None]] = []
    for query in queries:
        try:
            out.append((_execute(conn, query), None))
        except sqlite3.Error as exc:
            out.append((None, exc))
    return out


def _never(_: Exception) -> bool:
    """SQLite has one writer: no error of a statement calls for running the group again."""
    return False


def _execute(conn: sqlite3.Connection, step: Step) -> Any:
    if isinstance(step, Tx):
        if step is not Tx.ROLLBACK or conn.in_transaction:
            conn.execute(_TX[step])
        return None
    if isinstance(step, Ask):
        return False  # one statement writes one table here
    if step.shape == "each":
        conn.executemany(_sql(step.name), step.params["rows"])
        return None
    cur = conn.execute(_sql(step.name), _bind(step.params))
    if step.shape == "one":
        return cur.fetchone()
    if step.shape == "all":
        return cur.fetchall()
    return cur.rowcount


def _sql(name: str) -> str:
    if name == "data_version":
        return "PRAGMA data_version"
    return Q[name]


def _bind(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """Lists (of ids, of kinds, of rows) go to SQLite's ``json_each`` as JSON arrays; a
    statement without one (a row's insert) is bound as it is, not copied."""
    for value in params.values():
        if isinstance(value, LIST_TYPES):
            return {k: json.dumps(v) if isinstance(v, LIST_TYPES) else v for k, v in params.items()}
    return params


# -- schema ---------------------------------------------------------------------------------


def _statements(sql: str) -> list[str]:
    body = "\n".join(ln for ln in sql.splitlines() if not ln.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def _enable_wal(conn: sqlite3.Connection, patience_s: float) -> None:
    """Switching a new file to WAL answers "locked" at once (busy_timeout does not apply)
    when another process is doing the same: retry for a while instead of failing start-up."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class VersionReader:
    """One reader's place in the ledger's changes: the ``PRAGMA data_version`` it last saw,
    read every 20 ms while it waits."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._seen: int | None = None

    async def wait(self, timeout: float) -> bool:
        """True once another connection committed since this reader's last call returned
        (its first call only takes its place)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            version = await self._store._version()
            if self._seen is None:
                self._seen = version
            elif version != self._seen:
                self._seen = version
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(0.02, left))
