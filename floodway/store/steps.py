"""The steps a ledger rule asks its backend to take, one statement each.

The ledger's rules (:mod:`floodway.store.rules`) are written once, free of I/O, as generators:
each ``yield`` hands the backend one :class:`Query` (a named statement of the backend's
``queries.sql``, with its parameters) or one :class:`Tx` (transaction control), and receives its
result. SQLite drives a rule synchronously in its writer thread, PostgreSQL asynchronously on a
pooled connection (:mod:`floodway.store.drive`); what a backend owns is connections and SQL.

Writing a rule::

    def load(task_id: str) -> Rule[Task]:
        row = yield from one("get_task", id=task_id)
        ...

Parameters are plain Python values, which each backend binds its own way: a list or tuple of
scalars is a list parameter (a JSON array for SQLite's ``json_each``, an array for
PostgreSQL), a list of dicts is a set of rows for a statement on many rows (JSON records for
``json_each`` and PostgreSQL's ``json_to_recordset``). An ``each`` query runs its statement
once per row of ``rows``.

A backend's SQL may write several tables in one statement (PostgreSQL's data-modifying CTEs)
or not (SQLite): a rule that writes many rows and their events asks (:data:`Ask.MULTI_TABLE`)
and sends one statement, or the same steps a row at a time.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, TypeVar

T = TypeVar("T")

#: A row as the backends return it: columns by name.
Row = Mapping[str, Any]
#: The types of a list parameter, for ``isinstance``: a tuple of them, not ``list | tuple``,
#: which builds a new union (an object for the garbage collector) each time it is evaluated.
LIST_TYPES = (list, tuple)
Shape = Literal["one", "all", "count", "each"]


@dataclass(frozen=True)
class Query:
    """Run the named statement; the rule receives the first row or None (``one``), every row
    (``all``) or the number of rows it changed (``count``); ``each``: once per row of the
    ``rows`` parameter (the rule receives None)."""

    name: str
    params: Mapping[str, Any]
    shape: Shape


class Tx(Enum):
    """Transaction control, for the group commit (:mod:`floodway.store.group`). COMMIT_NOTIFY
    commits and tells the other processes sharing the ledger that tasks changed."""

    BEGIN = "begin"
    COMMIT = "commit"
    COMMIT_NOTIFY = "commit_notify"
    ROLLBACK = "rollback"
    SAVEPOINT = "savepoint"
    RELEASE = "release"
    ROLLBACK_TO = "rollback_to"


class Ask(Enum):
    """A question a rule asks its backend about its SQL: the answer is True or False."""

    #: may one statement write several tables (a row and its event, many rows at once)?
    MULTI_TABLE = "multi_table"


Step = Query | Tx | Ask
#: A rule: a generator of steps whose return value is the rule's answer.
Rule = Generator[Step, Any, T]


def one(query: str, /, **params: Any) -> Rule[Row | None]:
    row: Row | None = yield Query(query, params, "one")
    return row


def all_rows(query: str, /, **params: Any) -> Rule[list[Row]]:
    rows: list[Row] = yield Query(query, params, "all")
    return rows


def count(query: str, /, **params: Any) -> Rule[int]:
    """Run a write; the number of rows it changed."""
    changed: int = yield Query(query, params, "count")
    return changed


def each(query: str, rows: list[dict[str, Any]]) -> Rule[None]:
    """Run a write once per row (its parameters)."""
    yield Query(query, {"rows": rows}, "each")


def ask(question: Ask) -> Rule[bool]:
    answer: bool = yield question
    return answer
