"""Store fixtures for the contract suite: each test runs once per backend.

SQLite gets a fresh file under ``tmp_path``; PostgreSQL gets a fresh schema in the database
named by ``FLOODWAY_TEST_PG_URL`` (default: the local ``test`` database), dropped afterwards.
The PostgreSQL half is skipped, with the reason shown, when no server answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from floodway.store.base import Store
from floodway.store.postgres import PostgresStore
from floodway.store.sqlite import SqliteStore
from harness.pg import PG_URL, fresh_schema, postgres_unavailable

BACKENDS = ["sqlite", "postgres"]


@dataclass(frozen=True)
class Backend:
    """Where one test's ledger lives; :meth:`make` opens more stores on the same ledger."""

    name: str
    url: str
    schema: str | None = None

    def make(self, url: str | None = None) -> Store:
        if self.name == "sqlite":
            return SqliteStore(url or self.url)
        return PostgresStore(url or self.url, schema=self.schema)

    @asynccontextmanager
    async def opened(self, url: str | None = None) -> AsyncIterator[Store]:
        store = self.make(url)
        await store.open()
        try:
            yield store
        finally:
            await store.close()

    async def fetch(self, query: str) -> list[tuple[Any, ...]]:
        """Raw SQL, for facts the Store protocol does not expose (the migrations table)."""
        if self.name == "sqlite":
            import sqlite3

            db = sqlite3.connect(self.url.removeprefix("sqlite:///"))
            try:
                return list(db.execute(query).fetchall())
            finally:
                db.close()
        options = f"-c search_path={self.schema}"
        async with await psycopg.AsyncConnection.connect(self.url, options=options) as conn:
            cur = await conn.execute(query.encode())
            return list(await cur.fetchall())

    async def run(self, statements: list[str]) -> None:
        """Raw SQL writes in one transaction, for a ledger as an older release left it."""
        if self.name == "sqlite":
            import sqlite3

            db = sqlite3.connect(self.url.removeprefix("sqlite:///"))
            try:
                with db:
                    for statement in statements:
                        db.execute(statement)
            finally:
                db.close()
            return
        options = f"-c search_path={self.schema}"
        async with await psycopg.AsyncConnection.connect(self.url, options=options) as conn:
            for statement in statements:
                await conn.execute(statement.encode())


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        yield Backend("sqlite", f"sqlite:///{tmp_path}/t.db")
        return
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    async with fresh_schema() as schema:
        yield Backend("postgres", PG_URL, schema)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    async with backend.opened() as opened:
        yield opened
