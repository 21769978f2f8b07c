"""A PostgreSQL ledger of one's own on the shared test server: a fresh schema per test (or
per example of a property test), dropped afterwards.

The server is named by ``FLOODWAY_TEST_PG_URL`` (default: the local ``test`` database); when
it does not answer, :func:`postgres_unavailable` says why, for a skip that shows the reason.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote

import psycopg
from psycopg import sql

from harness.fleet import PG_URL

_down: str | None = None  # why PostgreSQL is unusable, once we know ("" once it answered)


def postgres_unavailable() -> str | None:
    """Why the test server cannot be used (None: it answers). Asked once per process."""
    global _down
    if _down is None:
        try:
            psycopg.connect(PG_URL, connect_timeout=3).close()
            _down = ""
        except psycopg.Error as exc:
            _down = f"PostgreSQL at {PG_URL} is unavailable: {exc}"
    return _down or None


def schema_url(schema: str, base_url: str = PG_URL) -> str:
    """A database URL whose connections work in ``schema`` (for ``Floodway(database=...)``,
    which takes a URL, not a schema)."""
    sep = "&" if "?" in base_url else "?"
    return f"{base_url}{sep}options={quote(f'-c search_path={schema}')}"


@asynccontextmanager
async def fresh_schema(base_url: str = PG_URL) -> AsyncIterator[str]:
    """The name of a new, empty schema on the server of ``base_url``; dropped afterwards with
    everything in it."""
    schema = f"fw_test_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(base_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema
    finally:
        async with await psycopg.AsyncConnection.connect(base_url, autocommit=True) as conn:
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            await conn.execute(drop)
