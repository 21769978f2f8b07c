"""Store fixtures for the contract suite: each test runs once per backend.

SQLite gets a fresh file under ``tmp_path``; PostgreSQL gets a fresh schema in the database
named by ``FLOODWAY_TEST_PG_URL`` (default: the local ``test`` database), dropped afterwards.
The PostgreSQL half is skipped, with the reason shown, when no server answers.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from floodway.store.base import Store
from floodway.store.postgres import PostgresStore
from floodway.store.sqlite import SqliteStore

PG_URL = os.environ.get("FLOODWAY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgres"]

_pg_down: str | None = None  # why PostgreSQL is unusable, once we know


def _postgres_unavailable() -> str | None:
    global _pg_down
    if _pg_down is None:
        try:
            psycopg.connect(PG_URL, connect_timeout=3).close()
            _pg_down = ""
        except psycopg.Error as exc:
            _pg_down = f"PostgreSQL at {PG_URL} is unavailable: {exc}"
    return _pg_down or None


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


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        yield Backend("sqlite", f"sqlite:///{tmp_path}/t.db")
        return
    reason = _postgres_unavailable()
    if reason:
        pytest.skip(reason)
    schema = f"fw_test_{uuid.uuid4().hex[:12]}"
    yield Backend("postgres", PG_URL, schema)
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        await conn.execute(drop)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    async with backend.opened() as opened:
        yield opened
