"""A real filesystem that fills up: a small tmpfs mounted for a test (``mount`` needs root,
as CI has; :func:`small_disk` raises :class:`DiskUnavailable` where it is not permitted, for
the caller to skip). ``fill()`` takes every free byte with a filler file, ``free()`` gives
them back, so the database on it sees the disk full (SQLite's ``SQLITE_FULL``) as it would
in production."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: one write of the filler
_CHUNK = b"\0" * 65536


class DiskUnavailable(Exception):
    """No tmpfs can be mounted here (not root, or no mount in this container)."""


@dataclass
class SmallDisk:
    path: Path

    @property
    def _filler(self) -> Path:
        return self.path / "filler"

    def fill(self) -> None:
        """Take every free byte. The WAL of each SQLite database on the disk is emptied into
        its file first, so that its next write must grow the WAL and finds no room."""
        for db in self.path.glob("*.db"):
            with contextlib.closing(sqlite3.connect(db)) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while True:
                os.write(fd, _CHUNK if os.statvfs(self.path).f_bavail else _CHUNK[:512])
        except OSError:
            pass  # ENOSPC: full
        finally:
            os.close(fd)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


@contextlib.contextmanager
def small_disk(where: Path, size: str = "4m") -> Iterator[SmallDisk]:
    """A tmpfs of ``size`` mounted at ``where`` for the block's duration."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        raise DiskUnavailable(mounted.stderr.decode(errors="replace").strip())
    try:
        yield SmallDisk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
