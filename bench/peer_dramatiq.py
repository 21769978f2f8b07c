"""Dramatiq's side of bench/peers.py: one no-op actor on a Redis broker (``DRAMATIQ_REDIS``).

DRAMATIQ_REDIS=redis://127.0.0.1:6379/0 dramatiq --processes 1 bench.peer_dramatiq
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

#: where a message waits until it is acknowledged: its count is what is left to drain
PENDING_KEY = "dramatiq:default.msgs"

URL = os.environ.get("DRAMATIQ_REDIS", "redis://127.0.0.1:6379/0")
dramatiq.set_broker(RedisBroker(url=URL))  # type: ignore[no-untyped-call]  # untyped upstream


@dramatiq.actor
def noop(n: int) -> None:
    return None
