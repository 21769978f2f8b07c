"""The fleet ledger: PostgreSQL, shared by every floodway process of a deployment."""

from floodway.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
