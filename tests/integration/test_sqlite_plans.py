"""SQLite picks its indexes without statistics (no ANALYZE): the statements that look tasks up
by id, by the work they wait on or by deadline must not walk the status index, which lists
every queued task. One such walk per completion made a drain quadratic in the queue's size."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from floodway import Floodway
from floodway.store.sqlite.store import Q

#: each statement and the index it must search
BY_INDEX = {
    "inherit_urgency": "tasks_waiters",
    "resolve_waiters": "tasks_waiters",
    "first_waiter": "tasks_waiters",
    "has_waiters": "tasks_waiters",
    "repoint_waiters": "tasks_waiters",
    "claim_ids": "sqlite_autoindex_tasks_1",
    "past_deadline": "tasks_deadlines",
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
