"""Who holds a lease: a worker of one process. A process has one identity, and every lease
owner it names starts with it, so a lease tells which process to ask whether it still lives
(:meth:`floodway.store.base.Store.dead`)."""

from __future__ import annotations

import os
import socket

from floodway.core.task import new_token


def new_identity() -> str:
    """``host:pid:token``, unique to one open ledger in one process."""
    return f"{socket.gethostname()}:{os.getpid()}:{new_token()[:6]}"


def owner_name(identity: str, role: str) -> str:
    """A lease owner of the process ``identity`` (``role``: ``w1``, ``poller``, ...)."""
    return f"{identity}:{role}"


def identity_of(owner: str) -> str | None:
    """The process identity of a lease owner (None: an owner not named by this module)."""
    parts = owner.split(":")
    return ":".join(parts[:3]) if len(parts) == 4 else None
