"""The ledger's rules on PostgreSQL, each run inside the caller's transaction.

The rules are the SQLite store's, step for step. What differs is concurrency: SQLite has one
writer, PostgreSQL many, so every read that a decision rests on either locks the row it reads
(``FOR UPDATE``) or is an ``INSERT ... ON CONFLICT`` that waits for a concurrent inserter.
Writers that end a task lock its row, then its fingerprint row, then its waiters' rows; a
submitter locks only the fingerprint row (its own new row is invisible to others). So the
usual paths queue instead of deadlocking; the store re-runs a transaction in the rare
deadlock PostgreSQL still reports (e.g. two batches completing the same tasks in opposite
orders).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Literal

from psycopg import sql as pgsql

from floodway.core.errors import (
    AdmissionRefused,
    IdempotencyConflict,
    IllegalTransition,
    TaskNotFound,
)
from floodway.core.outcome import Applied, Completion
from floodway.core.states import TERMINAL, Status, check_transition
from floodway.core.task import ErrorClass, ErrorInfo, Lane, NewTask, Submitted, Task, new_id
from floodway.store.base import TaskChange
from floodway.store.postgres.sql import MIGRATIONS, Conn, Q, many, one, run
from floodway.store.rows import (
    completion_params,
    dumps,
    insert_params,
    task_from_row,
)

KeyState = Literal["reserved", "expired"]


async def migrate(conn: Conn, schema: str | None) -> None:
    """Create ``schema`` if asked, then apply the pending migrations, all under one lock."""
    async with conn.transaction():
        await conn.execute(Q["migrations_lock"])
        if schema is not None:
            await conn.execute(
                pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema))
            )
        await conn.execute(Q["migrations_table"])
        done = {r["version"] for r in await many(conn, "migrations_applied")}
        for version, name, text in MIGRATIONS:
            if version not in done:
                # No parameters: psycopg sends the file's statements as one simple query.
                await conn.execute(text)
                await run(conn, "migration_done", {"version": version, "name": name})


async def event(
    conn: Conn, task_id: str, status: Status, now: float, attempt: int, detail: str = ""
) -> None:
    await run(
        conn,
        "insert_event",
        {
            "task_id": task_id,
            "status": status.value,
            "at": now,
            "attempt": attempt,
            "detail": detail,
        },
    )


async def load(conn: Conn, task_id: str, *, lock: bool = False) -> Task:
    row = await one(conn, "lock_task" if lock else "get_task", {"id": task_id})
    if row is None:
        raise TaskNotFound(task_id)
    return task_from_row(row)


# -- submit ---------------------------------------------------------------------------------


def mergeable(new: Sequence[NewTask]) -> bool:
    """Whether these tasks may share one INSERT with other submits' tasks. A depth check
    counts under a per-tenant lock: it takes :func:`submit_one`'s one-at-a-time path."""
    return not any(_checks_depth(n) for n in new)


def _checks_depth(new: NewTask) -> bool:
    return new.lane is Lane.INTERACTIVE and new.interactive_depth > 0


async def submit_many(
    conn: Conn, submits: Sequence[tuple[Sequence[NewTask], float]]
) -> list[list[Submitted]]:
    """Several :func:`mergeable` submits, each ``(tasks, now)``, as :func:`submit_one` would
    write them task after task, but in one statement (request keys, tasks, events,
    fingerprints): a burst of submits costs one round trip instead of two to four per task.
    Only a task whose request key is taken already (a replay, a conflict, an expired key) or
    whose work is owned already costs more: it goes on as in :func:`submit_one`."""
    flat = [(n, now, new_id(now)) for tasks, now in submits for n in tasks]
    if not flat:
        return [[] for _ in submits]
    given = records([_merged_params(task_id, n, now) for n, now, task_id in flat])
    rows = {r["id"]: r for r in await many(conn, "insert_tasks", {"rows": given})}
    found = iter(flat)
    results: list[list[Submitted]] = []
    for tasks, _ in submits:
        one_submit = []
        for n, now, task_id in (next(found) for _ in tasks):
            row = rows.get(task_id)
            if row is None:  # its request key was taken: reuse, conflict or an expired key
                one_submit.append(await submit_one(conn, n, now))
                continue
            task = task_from_row(row)
            if n.fingerprint is not None and not row["owns_work"]:
                task = await _claim_work(conn, task, n.fingerprint, now)
            one_submit.append(Submitted(task))
        results.append(one_submit)
    return results


def _merged_params(task_id: str, new: NewTask, now: float) -> dict[str, Any]:
    params = insert_params(task_id, new, now)
    if new.request_key is not None:
        params.update(request_hash=new.request_hash, key_expires_at=now + new.key_ttl_s)
    return params


def records(rows: list[dict[str, Any]]) -> str:
    """``rows`` as the one JSON parameter of a ``json_to_recordset`` query."""
    try:
        return json.dumps(rows, separators=(",", ":"), allow_nan=False)
    except ValueError:  # inf and nan are not JSON; double precision reads them from strings
        return json.dumps([{k: _finite(v) for k, v in r.items()} for r in rows])


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


async def submit_one(conn: Conn, new: NewTask, now: float) -> Submitted:
    task_id = new_id(now)
    key_state: KeyState | None = None
    if new.request_key is not None:
        found = await _reserve_key(conn, new, task_id, now)
        if isinstance(found, Submitted):
            return found
        key_state = found
    if _checks_depth(new):
        await _check_depth(conn, new)
    row = await one(conn, "insert_task", insert_params(task_id, new, now))
    assert row is not None  # INSERT ... RETURNING always returns the row
    await event(conn, task_id, Status.QUEUED, now, 0)
    task = task_from_row(row)
    if new.fingerprint is not None:
        task = await _claim_work(conn, task, new.fingerprint, now)
    if key_state == "expired":  # we hold the expired key's row: point it at the new task
        await run(conn, "put_request_key", _key_params(new, task.id, now))
    return Submitted(task)


def _key_params(new: NewTask, task_id: str, now: float) -> dict[str, Any]:
    return {
        "tenant": new.tenant,
        "key": new.request_key,
        "task_id": task_id,
        "request_hash": new.request_hash,
        "expires_at": now + new.key_ttl_s,
    }


async def _reserve_key(conn: Conn, new: NewTask, task_id: str, now: float) -> Submitted | KeyState:
    """Reserve the request key for ``task_id`` ("reserved"), find it expired and locked for
    us to overwrite ("expired"), or find it live: the task it names, or IdempotencyConflict."""
    while True:
        if await run(conn, "reserve_request_key", _key_params(new, task_id, now)) == 1:
            return "reserved"
        hit = await one(conn, "lock_request_key", {"tenant": new.tenant, "key": new.request_key})
        if hit is not None:
            break
        # The row was purged between the two statements: try to reserve it again.
    if hit["expires_at"] < now:
        return "expired"
    if hit["request_hash"] != new.request_hash:
        raise IdempotencyConflict(str(new.request_key), hit["task_id"])
    return Submitted(await load(conn, hit["task_id"]), reused=True)


async def _check_depth(conn: Conn, new: NewTask) -> None:
    # Count and insert under one per-tenant lock, so concurrent submitters cannot both see
    # room for one more; the lock ends with the transaction.
    await conn.execute(Q["lock_tenant_depth"], {"tenant": new.tenant})
    row = await one(conn, "count_interactive", {"tenant": new.tenant})
    depth = int(row["depth"]) if row else 0
    if depth >= new.interactive_depth:
        raise AdmissionRefused(
            "interactive_depth",
            f"too fast: tenant {new.tenant!r} already has {depth} interactive tasks in "
            f"flight (limit {new.interactive_depth}); wait for one to finish",
            retry_after=1.0,
        )


async def _claim_work(conn: Conn, task: Task, fp: str, now: float) -> Task:
    """Own the fingerprint, or reuse the succeeded result, or wait on the one in flight."""
    params = {"fingerprint": fp, "task_id": task.id, "now": now}
    while True:
        if await run(conn, "claim_fingerprint", params) == 1:
            return task
        # Locked: an owner that is completing right now finishes first, and an owner that
        # ends after us finds our task among its waiters.
        owner = await one(conn, "lock_fingerprint", {"fingerprint": fp})
        if owner is not None:
            break
        # The owner ended without heirs and dropped the row meanwhile: claim it again.
    if owner["state"] == "succeeded":
        source = await load(conn, owner["task_id"])
        check_transition(Status.QUEUED, Status.DEDUPED)
        await run(
            conn,
            "mark_deduped",
            {"id": task.id, "duplicate_of": source.id, "result": dumps(source.result), "now": now},
        )
        await event(conn, task.id, Status.DEDUPED, now, 0, f"result of {source.id}")
    else:
        await run(conn, "wait_for", {"id": task.id, "waits_for": owner["task_id"]})
    return await load(conn, task.id)


async def release_work(
    conn: Conn,
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
        # This UPDATE takes the fingerprint's lock before the waiters are read.
        marked = {"fingerprint": fp, "task_id": task_id, "now": now}
        if await run(conn, "fingerprint_succeeded", marked) == 0:
            return ()
        rows = await many(
            conn,
            "resolve_waiters",
            {"waits_for": task_id, "duplicate_of": task_id, "result": dumps(result), "now": now},
        )
        for r in rows:
            await event(conn, r["id"], Status.DEDUPED, now, 0, f"result of {task_id}")
            changes.append(TaskChange(r["id"], Status.DEDUPED, r["tenant"]))
        return tuple(r["id"] for r in rows)
    if to not in TERMINAL:
        return ()
    owner = await one(conn, "lock_fingerprint", {"fingerprint": fp})
    if owner is None or owner["task_id"] != task_id:
        return ()
    heir = await one(conn, "first_waiter", {"waits_for": task_id})
    if heir is None:
        await run(conn, "fingerprint_drop", {"fingerprint": fp, "task_id": task_id})
        return ()
    await run(
        conn,
        "fingerprint_handover",
        {"fingerprint": fp, "task_id": task_id, "new_task_id": heir["id"], "now": now},
    )
    await run(conn, "promote_waiter", {"id": heir["id"], "now": now})
    await run(conn, "repoint_waiters", {"waits_for": task_id, "new_task_id": heir["id"]})
    return (heir["id"],)


# -- status writes --------------------------------------------------------------------------


async def complete_many(
    conn: Conn, items: Sequence[Completion], now: float, changes: list[TaskChange]
) -> list[Applied]:
    """:func:`complete_one` for each item, in a few statements instead of a few per item.

    Taken in one go only when no item's write can change what another item's write sees:
    distinct tasks, none of them queued (releasing a fingerprint touches queued waiters
    only); otherwise item by item."""
    ids = [i.task_id for i in items]
    if (
        len(items) < 2
        or len(set(ids)) < len(ids)
        or any(i.expected is Status.QUEUED for i in items)
    ):
        return [await complete_one(conn, i, now, changes) for i in items]
    given = records(
        [{**completion_params(i, now), "detail": i.error.message if i.error else ""} for i in items]
    )
    moved = {r["id"]: r for r in await many(conn, "complete_many", {"rows": given, "now": now})}
    missed = [i for i in ids if i not in moved]
    current = (
        {r["id"]: Status(r["status"]) for r in await many(conn, "status_of_many", {"ids": missed})}
        if missed
        else {}
    )
    released = await _release_succeeded(conn, items, moved, now)
    applied: list[Applied] = []
    for item in items:
        row = moved.get(item.task_id)
        if row is None:
            applied.append(Applied(item.task_id, False, current.get(item.task_id)))
            continue
        changes.append(TaskChange(item.task_id, item.to, row["tenant"]))
        if item.task_id in released:
            heirs = released[item.task_id]
            changes.extend(heirs)
            freed = tuple(c.task_id for c in heirs)
        else:
            freed = await release_work(
                conn, item.task_id, row["fingerprint"], item.to, item.result, now, changes
            )
        applied.append(Applied(item.task_id, True, item.to, freed))
    return applied


async def _release_succeeded(
    conn: Conn, items: Sequence[Completion], moved: dict[str, Any], now: float
) -> dict[str, list[TaskChange]]:
    """:func:`release_work` for every item that succeeded with a fingerprint, at once: the
    changes of the waiters each one resolved, by owner (empty: owned nothing, freed none)."""
    done = [
        (i, moved[i.task_id]["fingerprint"])
        for i in items
        if i.to is Status.SUCCEEDED and i.task_id in moved and moved[i.task_id]["fingerprint"]
    ]
    if not done:
        return {}
    released: dict[str, list[TaskChange]] = {i.task_id: [] for i, _ in done}
    marked = records([{"fingerprint": fp, "task_id": i.task_id} for i, fp in done])
    owners = {
        r["task_id"]
        for r in await many(conn, "fingerprints_succeeded", {"rows": marked, "now": now})
    }
    if owners:
        owned = [
            {"owner": i.task_id, "result": dumps(i.result)} for i, _ in done if i.task_id in owners
        ]
        rows = await many(conn, "resolve_waiters_of", {"rows": records(owned), "now": now})
        for r in rows:
            released[r["owner"]].append(TaskChange(r["id"], Status.DEDUPED, r["tenant"]))
    return released


async def complete_one(
    conn: Conn, item: Completion, now: float, changes: list[TaskChange]
) -> Applied:
    row = await one(
        conn,
        "complete",
        completion_params(item, now),
    )
    if row is None:
        current = await one(conn, "status_of", {"id": item.task_id})
        return Applied(item.task_id, False, Status(current["status"]) if current else None)
    detail = item.error.message if item.error else ""
    await event(conn, item.task_id, item.to, now, row["attempts"], detail)
    changes.append(TaskChange(item.task_id, item.to, row["tenant"]))
    released = await release_work(
        conn, item.task_id, row["fingerprint"], item.to, item.result, now, changes
    )
    return Applied(item.task_id, True, item.to, released)


async def cancel(
    conn: Conn, task_id: str, tenant: str | None, now: float, changes: list[TaskChange]
) -> Task:
    task = await load(conn, task_id, lock=True)
    if tenant is not None and task.tenant != tenant:
        raise TaskNotFound(task_id)
    check_transition(task.status, Status.CANCELLED)
    if task.status is Status.RUNNING:
        await run(conn, "request_cancel_running", {"id": task_id, "now": now})
        return await load(conn, task_id)
    error = ErrorInfo(ErrorClass.CANCELLED, "cancelled", "cancelled by request")
    written = await one(
        conn,
        "cancel_now",
        {"id": task_id, "expected": task.status.value, "now": now, "error": dumps(error.to_json())},
    )
    if written is None:
        raise IllegalTransition(task.status, Status.CANCELLED, "the task changed meanwhile")
    await event(conn, task_id, Status.CANCELLED, now, task.attempts, "cancelled by request")
    changes.append(TaskChange(task_id, Status.CANCELLED, task.tenant))
    if task.waits_for is None:
        await release_work(conn, task_id, task.fingerprint, Status.CANCELLED, None, now, changes)
    return await load(conn, task_id)


async def manual_retry(
    conn: Conn, task_id: str, tenant: str | None, now: float, changes: list[TaskChange]
) -> Task:
    task = await load(conn, task_id, lock=True)
    if tenant is not None and task.tenant != tenant:
        raise TaskNotFound(task_id)
    check_transition(task.status, Status.QUEUED)
    written = await one(
        conn, "manual_retry", {"id": task_id, "expected": task.status.value, "now": now}
    )
    if written is None:
        raise IllegalTransition(task.status, Status.QUEUED, "the task changed meanwhile")
    await event(conn, task_id, Status.QUEUED, now, 0, "manual retry")
    changes.append(TaskChange(task_id, Status.QUEUED, task.tenant))
    if task.fingerprint is not None:
        await run(
            conn,
            "claim_fingerprint",
            {"fingerprint": task.fingerprint, "task_id": task_id, "now": now},
        )
    return await load(conn, task_id)
