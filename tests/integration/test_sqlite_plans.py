"""SQLite picks its indexes without statistics (no ANALYZE): the statements that look tasks up
by id, by the work they wait on or by deadline must not walk the status index, which lists
every queued task. One such walk per completion made a drain quadratic in the queue's size.
Commits do not copy the WAL back into the database inline: a checkpointer does. And a view's
scan (a count over every task) does not hold up the reads that work waits on, and a memory
ledger's reads do not trip on its writes."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from floodway import Floodway
from floodway.store.base import ReadyQuery
from floodway.store.sqlite import store as sqlite_store
from floodway.store.sqlite.store import SCANS, Q, SqliteStore
from floodway.store.steps import Query

#: each statement and the index it must search
BY_INDEX = {
    "inherit_urgency": "tasks_waiters",
    "resolve_waiters": "tasks_waiters",
    "first_waiter": "tasks_waiters",
    "repoint_waiters": "tasks_waiters",
    "claim_ids": "sqlite_autoindex_tasks_1",
    "past_deadline": "tasks_deadlines",
    "count_interactive": "tasks_interactive",
}


@pytest.fixture
async def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "plans.db"
    async with Floodway(database=f"sqlite:///{path}"):
        pass  # migrated
    return path


@pytest.mark.parametrize("name", sorted(BY_INDEX))
def test_statement_searches_its_own_index_not_the_status_one(ledger: Path, name: str) -> None:
    sql = Q[name]
    params = {p: "[]" if p in ("ids", "kinds") else None for p in re.findall(r":(\w+)", sql)}
    with sqlite3.connect(ledger) as db:
        plan = " | ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    assert "tasks_status_seq" not in plan
    assert f"SEARCH tasks USING INDEX {BY_INDEX[name]}" in plan or (
        f"SEARCH w USING INDEX {BY_INDEX[name]}" in plan
    ), plan


async def test_commits_leave_the_wal_to_the_checkpointer(tmp_path: Path) -> None:
    """The writer never checkpoints inline; the store's own checkpointer copies the WAL."""
    path = tmp_path / "wal.db"
    fw = Floodway(database=f"sqlite:///{path}")

    @fw.kind("k", dedupe=False)
    async def handler(ctx: object, value: dict[str, int]) -> None:
        return None

    async with fw:
        await fw.submit_many("k", [{"n": n} for n in range(2000)])
        store = fw.runtime.store
        assert isinstance(store, SqliteStore) and store.checkpointer is not None
        busy, frames, copied = store.checkpointer.checkpoint()
        assert busy == 0 and frames > 0 and copied == frames
        conn = store.connect()  # set up as the store's own connections are
        try:
            assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
            assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 2000
        finally:
            conn.close()


async def test_a_scan_does_not_hold_up_a_look_at_a_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the count of every task (what the API samples every few seconds) is held in
    SQLite, a waiter's read of its task and a dispatcher's listing still answer."""
    held, release = threading.Event(), threading.Event()
    read_one = sqlite_store._read_one

    def slow_scans(conn: sqlite3.Connection, queries: Sequence[Query]) -> list[Any]:
        if any(q.name == "stats" for q in queries):
            held.set()
            release.wait(30)
        return read_one(conn, queries)

    assert set(Q) >= SCANS  # each a statement of the backend's
    monkeypatch.setattr(sqlite_store, "_read_one", slow_scans)
    fw = Floodway(database=f"sqlite:///{tmp_path / 'scan.db'}")

    @fw.kind("k")
    async def handler(ctx: object, value: dict[str, int]) -> None:
        return None

    async with fw:
        task = await fw.submit("k", {"n": 1})
        counting = asyncio.create_task(fw.stats())
        await asyncio.to_thread(held.wait, 30)
        try:
            seen = await asyncio.wait_for(fw.get(task.id), timeout=10)
            assert seen.id == task.id
            listing = fw.runtime.store.ready(ReadyQuery(("k",), fw.clock.now(), 16))
            assert [c.task_id for c in await asyncio.wait_for(listing, timeout=10)] == [task.id]
            assert not counting.done()  # the count is still held: the read went beside it
        finally:
            release.set()
        assert (await counting).by_status["queued"] == 1


async def test_a_memory_ledger_reads_beside_its_writes() -> None:
    """A memory database's connections share one cache, whose table locks failed reads that
    met a write ("database table is locked"): lists and counts while tasks run, all answer."""
    fw = Floodway(database="sqlite://:memory:")

    @fw.kind("k")
    async def handler(ctx: object, value: dict[str, int]) -> dict[str, int]:
        return value

    async with fw, fw.worker(concurrency=16):
        done = asyncio.Event()

        async def look() -> int:
            looks = 0
            while not done.is_set():
                await fw.stats()
                await fw.list_tasks()
                looks += 1
            return looks

        looking = asyncio.create_task(look())
        tasks = await fw.submit_many("k", [{"n": n} for n in range(500)])
        ended = [await fw.wait(t.id, timeout=60) for t in tasks]
        done.set()
        assert await looking > 0
    assert {t.status.value for t in ended} == {"succeeded"}
