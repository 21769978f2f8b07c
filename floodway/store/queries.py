"""Named SQL queries, read from a backend's ``queries.sql`` (blocks opened by
``-- name: NAME``)."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


#: every backend's query files: the task ledger's, the OpenAI Batch API's files and batches, and
#: multi-step jobs', and the provider batches of the batch tier
QUERY_FILES = ("queries.sql", "openai.sql", "jobs.sql", "tiers.sql")


def load_queries(package: str) -> dict[str, str]:
    """The named queries of the package's :data:`QUERY_FILES`; a name given twice is an
    error, not a silent override."""
    queries: dict[str, str] = {}
    for filename in QUERY_FILES:
        text = resources.files(package).joinpath(filename).read_text()
        parts = _NAME.split(text)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise ValueError(f"{package}: query {name!r} is named twice")
            lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
            queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def load_migrations(package: str) -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` for every ``NNN_name.sql`` in the package, in order."""
    found = []
    for entry in resources.files(package).iterdir():
        m = re.match(r"^(\d+)_(\w+)\.sql$", entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2), entry.read_text()))
    return sorted(found)
