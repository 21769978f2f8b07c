"""Pick the store for a database URL."""

from __future__ import annotations

import re
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from floodway.core.errors import StoreError
from floodway.store.base import Store
from floodway.store.jobs import JobRecords
from floodway.store.openai_records import OpenAIRecords
from floodway.store.tier_records import TierRecords


class FullStore(Store, OpenAIRecords, JobRecords, TierRecords, Protocol):
    """What every ledger is: the core :class:`Store`, and beside it the OpenAI records, the
    jobs and the batch tier's records."""


def open_store(url: str) -> FullStore:
    """A store for ``url`` (not yet opened): ``sqlite:///file.db`` or ``postgresql://...``."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite" or url == ":memory:":
        from floodway.store.sqlite import SqliteStore

        return SqliteStore(url)
    if scheme in ("postgresql", "postgres"):
        try:
            from floodway.store.postgres import PostgresStore
        except ImportError as exc:  # pragma: no cover - shipped with the package
            raise StoreError(f"PostgreSQL store unavailable: {exc}") from exc
        return PostgresStore(url)
    raise StoreError(
        f"unsupported database URL {url!r}: use sqlite:///path/to/file.db or postgresql://..."
    )


def redact(url: str) -> str:
    """The URL without its password, for error messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return re.sub(r"password\s*=\s*\S+", "password=***", url)
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
