"""SQLite picks its indexes without statistics (no ANALYZE): the statements that look tasks up
by id, by the work they wait on or by deadline must not walk the status index, which lists
every queued task. One such walk per completion made a drain quadratic in the queue's size.
And commits do not copy the WAL back into the database inline: a checkpointer does."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from floodway import Floodway
from floodway.store.sqlite.store import Q, SqliteStore

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
