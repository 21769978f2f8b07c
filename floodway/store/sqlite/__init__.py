from floodway.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
