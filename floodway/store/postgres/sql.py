"""The PostgreSQL store's named queries and numbered migrations, loaded once."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow

from floodway.store.queries import load_migrations, load_queries

Q = load_queries("floodway.store.postgres")
MIGRATIONS = load_migrations("floodway.store.postgres.migrations")

#: A pooled connection: autocommit (writes open explicit transactions), rows as dicts.
Conn = AsyncConnection[DictRow]


async def one(conn: Conn, name: str, params: dict[str, Any] | None = None) -> DictRow | None:
    cur = await conn.execute(Q[name], params)
    return await cur.fetchone()


async def many(conn: Conn, name: str, params: dict[str, Any] | None = None) -> list[DictRow]:
    cur = await conn.execute(Q[name], params)
    return await cur.fetchall()


async def run(conn: Conn, name: str, params: dict[str, Any] | None = None) -> int:
    """Execute a write; the number of rows it touched."""
    cur = await conn.execute(Q[name], params)
    return cur.rowcount
