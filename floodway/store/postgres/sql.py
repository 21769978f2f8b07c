"""The PostgreSQL store's named queries and numbered migrations, loaded once."""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg.rows import DictRow

from floodway.store.queries import load_migrations, load_queries

Q = load_queries("floodway.store.postgres")
MIGRATIONS = load_migrations("floodway.store.postgres.migrations")

#: A pooled connection: autocommit (writes open explicit transactions), rows as dicts.
Conn = AsyncConnection[DictRow]
