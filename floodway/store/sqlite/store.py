"""The embedded ledger: one SQLite file in WAL mode, one writer thread, one reader thread."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from floodway.core.errors import (
    AdmissionRefused,
    IdempotencyConflict,
    IllegalTransition,
    StoreError,
    TaskNotFound,
)
from floodway.core.outcome import Applied, Completion
from floodway.core.states import CLAIMABLE, TERMINAL, Status, check_transition
from floodway.core.task import ErrorClass, ErrorInfo, Lane, NewTask, Submitted, Task, new_id
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
from floodway.store.queries import load_migrations, load_queries
from floodway.store.rows import (
    candidate_from_row,
    claim_args,
    completion_params,
    dumps,
    insert_params,
    list_params,
    list_query,
    park_params,
    task_from_row,
)
from floodway.store.sqlite.threads import ConnectionThread

T = TypeVar("T")
Q = load_queries("floodway.store.sqlite")
MIGRATIONS = load_migrations("floodway.store.sqlite.migrations")

for _state in CLAIMABLE:  # the claim queries move these to running: keep them in the table
    check_transition(_state, Status.RUNNING)


def sqlite_path(url: str) -> tuple[str, bool]:
    """``sqlite:///rel.db`` -> ``rel.db``; ``sqlite:////abs.db`` -> ``/abs.db``;
    ``sqlite://:memory:`` -> a private shared-cache memory database. Returns (target, uri)."""
    if url in ("sqlite://:memory:", "sqlite:///:memory:", ":memory:"):
        return f"file:floodway-{uuid.uuid4().hex}?mode=memory&cache=shared", True
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise StoreError(f"not a SQLite URL: {url!r} (use sqlite:///path/to/file.db)")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise StoreError(f"SQLite URL {url!r} names no file")
    return path, False


class SqliteStore:
    def __init__(self, url: str, *, busy_timeout_s: float = 30.0) -> None:
        self.url = url
        self._target, self._uri = sqlite_path(url)
        self._busy_ms = int(busy_timeout_s * 1000)
        self._listeners: list[ChangeListener] = []
        self._writer = ConnectionThread(self._connect, "floodway-sqlite-writer", group=True)
        self._reader = ConnectionThread(self._connect, "floodway-sqlite-reader", group=False)
        self._keepalive: sqlite3.Connection | None = None
        self._data_version = -1
        self._opened = False

    # -- lifecycle -----------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
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
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute("PRAGMA cache_size = -32000")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open {self.url}: {exc}") from exc
        return conn

    async def open(self) -> None:
        if self._opened:
            return
        if self._uri:  # a memory database lives while one connection holds it
            self._keepalive = self._connect()
        await asyncio.to_thread(self._writer.start)
        await asyncio.to_thread(self._reader.start)
        self._opened = True
        try:
            await self._writer.run(_migrate)
        except sqlite3.Error as exc:
            await self.close()
            raise StoreError(f"cannot migrate {self.url}: {exc}") from exc

    async def close(self) -> None:
        if not self._opened:
            return
        self._opened = False
        await asyncio.to_thread(self._writer.stop)
        await asyncio.to_thread(self._reader.stop)
        if self._keepalive is not None:
            self._keepalive.close()

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def _notify(self, changes: Sequence[TaskChange]) -> None:
        if changes:
            for listener in self._listeners:
                listener(changes)

    async def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if not self._opened:
            raise StoreError("store is not open")
        try:
            return await self._writer.run(op)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.url}: {exc}") from exc

    async def _write_noting(self, op: Callable[[sqlite3.Connection, list[TaskChange]], T]) -> T:
        """``_write`` for an op that records the tasks it changed; this process's listeners
        hear them after the commit. Each run of the op gets a fresh list: an op can run twice
        (a group that ran into a failing write runs again, each write in a savepoint)."""

        def run(c: sqlite3.Connection) -> tuple[T, list[TaskChange]]:
            changes: list[TaskChange] = []
            return op(c, changes), changes

        value, changes = await self._write(run)
        self._notify(changes)
        return value

    async def _read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if not self._opened:
            raise StoreError("store is not open")
        try:
            return await self._reader.run(op)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.url}: {exc}") from exc

    async def wait_for_change(self, timeout: float) -> bool:
        """Watch ``PRAGMA data_version`` (a cheap read that changes when another connection
        commits) every 20 ms, so submits from other processes are seen without hammering."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            version = await self._read(lambda c: c.execute("PRAGMA data_version").fetchone()[0])
            if self._data_version == -1:
                self._data_version = version
            elif version != self._data_version:
                self._data_version = version
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(0.02, left))

    # -- submit and read -----------------------------------------------------------------
    async def submit(self, new: Sequence[NewTask], now: float) -> list[Submitted]:
        results = await self._write(lambda c: [_submit_one(c, n, now) for n in new])
        self._notify(
            [TaskChange(s.task.id, s.task.status, s.task.tenant) for s in results if not s.reused]
        )
        return results

    async def get(self, task_id: str, tenant: str | None = None) -> Task | None:
        row = await self._read(lambda c: c.execute(Q["get_task"], {"id": task_id}).fetchone())
        if row is None or (tenant is not None and row["tenant"] != tenant):
            return None
        return task_from_row(row)

    async def list_tasks(self, query: TaskQuery) -> list[Task]:
        params = list_params(query)
        sql = Q[list_query(query)]
        rows = await self._read(lambda c: c.execute(sql, params).fetchall())
        return [task_from_row(r) for r in rows]

    async def events(self, task_id: str, after_seq: int = 0) -> list[TaskEvent]:
        rows = await self._read(
            lambda c: c.execute(
                Q["list_events"], {"task_id": task_id, "after_seq": after_seq}
            ).fetchall()
        )
        return [
            TaskEvent(
                r["seq"], r["task_id"], Status(r["status"]), r["at"], r["attempt"], r["detail"]
            )
            for r in rows
        ]

    async def stats(self) -> StoreStats:
        rows = await self._read(lambda c: c.execute(Q["stats"]).fetchall())
        by_status: dict[str, int] = {s.value: 0 for s in Status}
        by_kind: dict[str, dict[str, int]] = {}
        for kind, status, count in rows:
            by_status[status] += count
            by_kind.setdefault(kind, {})[status] = count
        return StoreStats(by_status, by_kind)

    async def batch_counts(self, batch_id: str, tenant: str | None) -> dict[str, int]:
        params = {"batch_id": batch_id, "tenant": tenant}
        rows = await self._read(lambda c: c.execute(Q["batch_counts"], params).fetchall())
        return {r["status"]: r["count"] for r in rows}

    # -- the worker's hot path -------------------------------------------------------------
    async def ready(self, query: ReadyQuery) -> list[Candidate]:
        params = {"kinds": json.dumps(query.kinds), "now": query.now, "limit": query.limit}
        rows = await self._read(lambda c: c.execute(Q["ready"], params).fetchall())
        return [candidate_from_row(r) for r in rows]

    async def claim(self, params: ClaimParams) -> list[Task]:
        args = claim_args(params)
        if params.ids is None:
            sql = Q["claim_next"]
            args.update(kinds=json.dumps(params.kinds), limit=params.limit)
        else:
            sql = Q["claim_ids"]
            args.update(ids=json.dumps(params.ids))

        def op(c: sqlite3.Connection) -> list[Task]:
            tasks = [task_from_row(r) for r in c.execute(sql, args).fetchall()]
            c.executemany(
                Q["insert_event"],
                [
                    {
                        "task_id": t.id,
                        "status": "running",
                        "at": params.now,
                        "attempt": t.attempts,
                        "detail": params.owner,
                    }
                    for t in tasks
                ],
            )
            return tasks

        tasks = await self._write(op)
        tasks.sort(key=lambda t: (t.lane.rank, t.seq))
        self._notify([TaskChange(t.id, t.status, t.tenant) for t in tasks])
        return tasks

    async def complete(self, items: Sequence[Completion], now: float) -> list[Applied]:
        for item in items:
            check_transition(item.expected, item.to)
            if item.expected is Status.RUNNING and item.lease_token is None and not item.parked:
                raise IllegalTransition(item.expected, item.to, "a running task needs its lease")
        return await self._write_noting(
            lambda c, changes: [_complete_one(c, i, now, changes) for i in items]
        )

    async def heartbeat(
        self, leases: Sequence[tuple[str, str]], now: float, lease_s: float
    ) -> HeartbeatResult:
        def op(c: sqlite3.Connection) -> HeartbeatResult:
            lost, cancel = [], []
            for task_id, token in leases:
                row = c.execute(
                    Q["heartbeat"],
                    {"id": task_id, "token": token, "now": now, "expires_at": now + lease_s},
                ).fetchone()
                if row is None:
                    lost.append(task_id)
                elif row[0]:
                    cancel.append(task_id)
            return HeartbeatResult(tuple(lost), tuple(cancel))

        return await self._write(op)

    async def set_upstream_ref(self, task_id: str, lease_token: str, ref: str, now: float) -> bool:
        params = {"id": task_id, "token": lease_token, "ref": ref, "now": now}
        return await self._write(lambda c: c.execute(Q["set_upstream_ref"], params).rowcount == 1)

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
        return await self._write(lambda c: c.execute(Q["park"], params).rowcount == 1)

    async def claim_parked(self, params: ClaimParams) -> list[Task]:
        args = {
            "owner": params.owner,
            "token": params.token,
            "now": params.now,
            "expires_at": params.now + params.lease_s,
            "kinds": json.dumps(params.kinds),
            "limit": params.limit,
        }
        rows = await self._write(lambda c: c.execute(Q["claim_parked"], args).fetchall())
        return [task_from_row(r) for r in rows]

    async def next_parked_at(self) -> float | None:
        row = await self._read(lambda c: c.execute(Q["next_parked_at"]).fetchone())
        return None if row is None else row[0]

    async def find_upstream(self, kind: str, ref: str) -> Task | None:
        row = await self._read(
            lambda c: c.execute(Q["find_upstream"], {"kind": kind, "ref": ref}).fetchone()
        )
        return None if row is None else task_from_row(row)

    async def due_callbacks(self, now: float, limit: int) -> list[Task]:
        rows = await self._read(
            lambda c: c.execute(Q["due_callbacks"], {"now": now, "limit": limit}).fetchall()
        )
        return [task_from_row(r) for r in rows]

    async def callback_result(self, task_id: str, state: str, next_at: float | None) -> None:
        params = {"id": task_id, "state": state, "next_at": next_at}
        await self._write(lambda c: c.execute(Q["callback_result"], params))

    # -- requests from people ------------------------------------------------------------
    async def request_cancel(self, task_id: str, tenant: str | None, now: float) -> Task:
        return await self._write_noting(
            lambda c, changes: _cancel(c, task_id, tenant, now, changes)
        )

    async def manual_retry(self, task_id: str, tenant: str | None, now: float) -> Task:
        return await self._write_noting(
            lambda c, changes: _manual_retry(c, task_id, tenant, now, changes)
        )

    # -- maintenance -----------------------------------------------------------------------
    async def expired_leases(self, now: float, limit: int) -> list[Task]:
        rows = await self._read(
            lambda c: c.execute(Q["expired_leases"], {"now": now, "limit": limit}).fetchall()
        )
        return [task_from_row(r) for r in rows]

    async def past_deadline(self, now: float, limit: int) -> list[Task]:
        rows = await self._read(
            lambda c: c.execute(Q["past_deadline"], {"now": now, "limit": limit}).fetchall()
        )
        return [task_from_row(r) for r in rows]

    async def purge(self, retention: Retention) -> Purged:
        def op(c: sqlite3.Connection) -> Purged:
            results_before = retention.now - retention.result_ttl_s
            rows_before = retention.now - retention.row_ttl_s
            cleared = c.execute(Q["purge_results"], {"before": results_before}).rowcount
            c.execute(Q["purge_fingerprints"], {"before": results_before})
            deleted = c.execute(Q["purge_rows"], {"before": rows_before}).rowcount
            c.execute(Q["purge_events"], {"before": rows_before})
            keys = c.execute(Q["purge_keys"], {"now": retention.now}).rowcount
            return Purged(cleared, deleted, keys)

        return await self._write(op)

    async def try_lead(self, name: str, owner: str, now: float, ttl_s: float) -> bool:
        params = {"name": name, "owner": owner, "now": now, "expires_at": now + ttl_s}
        row = await self._write(lambda c: c.execute(Q["try_lead"], params).fetchone())
        return row is not None


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


# -- the ledger's rules, run inside the writer's transaction ---------------------------------


def _migrate(c: sqlite3.Connection) -> None:
    c.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations "
        "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    done = {r[0] for r in c.execute("SELECT version FROM schema_migrations")}
    for version, name, sql in MIGRATIONS:
        if version in done:
            continue
        for statement in _statements(sql):
            c.execute(statement)
        c.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) "
            "VALUES (?, ?, datetime('now'))",
            (version, name),
        )


def _statements(sql: str) -> list[str]:
    body = "\n".join(ln for ln in sql.splitlines() if not ln.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def _event(
    c: sqlite3.Connection, task_id: str, status: Status, now: float, attempt: int, detail: str = ""
) -> None:
    c.execute(
        Q["insert_event"],
        {
            "task_id": task_id,
            "status": status.value,
            "at": now,
            "attempt": attempt,
            "detail": detail,
        },
    )


def _load(c: sqlite3.Connection, task_id: str) -> Task:
    row = c.execute(Q["get_task"], {"id": task_id}).fetchone()
    if row is None:
        raise TaskNotFound(task_id)
    return task_from_row(row)


def _submit_one(c: sqlite3.Connection, new: NewTask, now: float) -> Submitted:
    if new.idempotency_key is not None:
        hit = c.execute(
            Q["get_request_key"], {"tenant": new.tenant, "key": new.idempotency_key}
        ).fetchone()
        if hit is not None and hit["expires_at"] >= now:
            if hit["request_hash"] != new.request_hash:
                raise IdempotencyConflict(new.idempotency_key, hit["task_id"])
            return Submitted(_load(c, hit["task_id"]), reused=True)
    if new.lane is Lane.INTERACTIVE and new.interactive_depth > 0:
        depth = c.execute(Q["count_interactive"], {"tenant": new.tenant}).fetchone()[0]
        if depth >= new.interactive_depth:
            raise AdmissionRefused(
                "interactive_depth",
                f"too fast: tenant {new.tenant!r} already has {depth} interactive tasks in "
                f"flight (limit {new.interactive_depth}); wait for one to finish",
                retry_after=1.0,
            )
    task_id = new_id(now)
    row = c.execute(Q["insert_task"], insert_params(task_id, new, now)).fetchone()
    _event(c, task_id, Status.QUEUED, now, 0)
    task = task_from_row(row)
    if new.fingerprint is not None:
        task = _claim_work(c, task, new.fingerprint, now)
    if new.idempotency_key is not None:
        c.execute(
            Q["put_request_key"],
            {
                "tenant": new.tenant,
                "key": new.idempotency_key,
                "task_id": task.id,
                "request_hash": new.request_hash,
                "expires_at": now + new.key_ttl_s,
            },
        )
    return Submitted(task)


def _claim_work(c: sqlite3.Connection, task: Task, fp: str, now: float) -> Task:
    """Own the fingerprint, or reuse the succeeded result, or wait on the one in flight."""
    if (
        c.execute(
            Q["claim_fingerprint"], {"fingerprint": fp, "task_id": task.id, "now": now}
        ).rowcount
        == 1
    ):
        return task
    owner = c.execute(Q["get_fingerprint"], {"fingerprint": fp}).fetchone()
    if owner["state"] == "succeeded":
        source = _load(c, owner["task_id"])
        check_transition(Status.QUEUED, Status.DEDUPED)
        c.execute(
            Q["mark_deduped"],
            {"id": task.id, "duplicate_of": source.id, "result": dumps(source.result), "now": now},
        )
        _event(c, task.id, Status.DEDUPED, now, 0, f"result of {source.id}")
    else:
        c.execute(Q["wait_for"], {"id": task.id, "waits_for": owner["task_id"]})
    return _load(c, task.id)


def _release_work(
    c: sqlite3.Connection,
    task_id: str,
    fp: str | None,
    to: Status,
    result: Any,
    now: float,
    changes: list[TaskChange],
) -> tuple[str, ...]:
    """A task that owned a fingerprint ended: hand its result (or the work) to its waiters."""
    if fp is None:
        return ()
    if to is Status.SUCCEEDED:
        if (
            c.execute(
                Q["fingerprint_succeeded"], {"fingerprint": fp, "task_id": task_id, "now": now}
            ).rowcount
            == 0
        ):
            return ()
        rows = c.execute(
            Q["resolve_waiters"],
            {"waits_for": task_id, "duplicate_of": task_id, "result": dumps(result), "now": now},
        ).fetchall()
        for r in rows:
            _event(c, r["id"], Status.DEDUPED, now, 0, f"result of {task_id}")
            changes.append(TaskChange(r["id"], Status.DEDUPED, r["tenant"]))
        return tuple(r["id"] for r in rows)
    if to not in TERMINAL:
        return ()
    heir = c.execute(Q["first_waiter"], {"waits_for": task_id}).fetchone()
    if heir is None:
        c.execute(Q["fingerprint_drop"], {"fingerprint": fp, "task_id": task_id})
        return ()
    if c.execute(
        Q["fingerprint_handover"],
        {"fingerprint": fp, "task_id": task_id, "new_task_id": heir["id"], "now": now},
    ).rowcount:
        c.execute(Q["promote_waiter"], {"id": heir["id"], "now": now})
        c.execute(Q["repoint_waiters"], {"waits_for": task_id, "new_task_id": heir["id"]})
        return (heir["id"],)
    return ()


def _complete_one(
    c: sqlite3.Connection, item: Completion, now: float, changes: list[TaskChange]
) -> Applied:
    row = c.execute(
        Q["complete"],
        completion_params(item, now),
    ).fetchone()
    if row is None:
        current = c.execute(Q["status_of"], {"id": item.task_id}).fetchone()
        return Applied(item.task_id, False, Status(current[0]) if current else None)
    detail = item.error.message if item.error else ""
    _event(c, item.task_id, item.to, now, row["attempts"], detail)
    changes.append(TaskChange(item.task_id, item.to, row["tenant"]))
    released = _release_work(
        c, item.task_id, row["fingerprint"], item.to, item.result, now, changes
    )
    return Applied(item.task_id, True, item.to, released)


def _cancel(
    c: sqlite3.Connection, task_id: str, tenant: str | None, now: float, changes: list[TaskChange]
) -> Task:
    task = _load(c, task_id)
    if tenant is not None and task.tenant != tenant:
        raise TaskNotFound(task_id)
    check_transition(task.status, Status.CANCELLED)
    if task.status is Status.RUNNING:
        c.execute(Q["request_cancel_running"], {"id": task_id, "now": now})
        return _load(c, task_id)
    error = ErrorInfo(ErrorClass.CANCELLED, "cancelled", "cancelled by request")
    if (
        c.execute(
            Q["cancel_now"],
            {
                "id": task_id,
                "expected": task.status.value,
                "now": now,
                "error": dumps(error.to_json()),
            },
        ).fetchone()
        is None
    ):
        raise IllegalTransition(task.status, Status.CANCELLED, "the task changed meanwhile")
    _event(c, task_id, Status.CANCELLED, now, task.attempts, "cancelled by request")
    changes.append(TaskChange(task_id, Status.CANCELLED, task.tenant))
    if task.waits_for is None:
        _release_work(c, task_id, task.fingerprint, Status.CANCELLED, None, now, changes)
    return _load(c, task_id)


def _manual_retry(
    c: sqlite3.Connection, task_id: str, tenant: str | None, now: float, changes: list[TaskChange]
) -> Task:
    task = _load(c, task_id)
    if tenant is not None and task.tenant != tenant:
        raise TaskNotFound(task_id)
    check_transition(task.status, Status.QUEUED)
    if (
        c.execute(
            Q["manual_retry"], {"id": task_id, "expected": task.status.value, "now": now}
        ).fetchone()
        is None
    ):
        raise IllegalTransition(task.status, Status.QUEUED, "the task changed meanwhile")
    _event(c, task_id, Status.QUEUED, now, 0, "manual retry")
    changes.append(TaskChange(task_id, Status.QUEUED, task.tenant))
    if task.fingerprint is not None:
        c.execute(
            Q["claim_fingerprint"],
            {"fingerprint": task.fingerprint, "task_id": task_id, "now": now},
        )
    return _load(c, task_id)
