"""Every quoted word in the backends' SQL is a word the code defines: a task's status of
``floodway/core/states.py``, or one of the few other things the ledger stores as text. A status
misspelt in a statement fails here, not in the one path that runs it."""

from __future__ import annotations

import re

import pytest

from floodway.core.states import Status
from floodway.core.task import Lane
from floodway.store.queries import load_queries

#: the quoted words that are not a task's status, and what each is
OTHER_WORDS = {
    "inflight": "a fingerprint's state: its work is running (the other is 'succeeded')",
    "pending": "a callback's state: to deliver (also 'delivered', 'failed', as parameters)",
    "orphan:": "the lease token of an attempt left open without a worker",
    "in_progress": "an OpenAI batch's status",
    "cancelling": "an OpenAI batch's status",
    "": "an event without detail",
    "search_path": "PostgreSQL's setting",
    "floodway_changes": "PostgreSQL's NOTIFY channel of this ledger",
    "advisory": "PostgreSQL's kind of lock (pg_locks.locktype)",
    "type": "PostgreSQL's ->> of a task error's field (SQLite's is a $.type path)",
}
_QUOTED = re.compile(r"'([^']*)'")
_JSON_PATH = re.compile(r"^\$\.\w+$")  # SQLite's json_extract of a row's field


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_every_quoted_word_in_the_sql_is_a_status_or_named_here(backend: str) -> None:
    known = {s.value for s in Status} | {lane.value for lane in Lane} | set(OTHER_WORDS)
    unknown = {
        (name, word)
        for name, sql in load_queries(f"floodway.store.{backend}").items()
        for word in _QUOTED.findall(sql)
        if word not in known and not _JSON_PATH.match(word)
    }
    assert unknown == set()
