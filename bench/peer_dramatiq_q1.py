"""Dramatiq's side of Q1's peer (``python -m bench.quota Q1 --peers``): one actor calling the
simulated provider, kept to its cap of 10 the way Dramatiq's documentation does it.

DRAMATIQ_REDIS=redis://... SIM_URL=http://... dramatiq bench.peer_dramatiq_q1

* the cap: a ``ConcurrentRateLimiter`` (limit 10) on a ``RedisBackend``, held around the call;
  a worker thread that finds it full raises ``RateLimitExceeded``, and the message is retried;
* retries: the ``Retries`` middleware at its defaults (20 retries, exponential backoff with
  jitter) but for the first backoff, ``min_backoff`` 500 ms (an actor option) instead of its
  15 s: floodway's first retry is within 0.5 s too. A 5xx raises (``raise_for_status``), so
  it is retried the same way;
* the worker: the ``dramatiq`` command with no flags (a process per core, 8 threads each);
* each call carries an ``Idempotency-Key`` (the task's tag and number), so the provider's
  ledger tells whether anything was billed twice.
"""

from __future__ import annotations

import os
import threading

import dramatiq
import httpx
from dramatiq.brokers.redis import RedisBroker
from dramatiq.rate_limits import ConcurrentRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

from bench.apps.q1 import CAP

ACTOR = "generate"
#: the first retry's backoff (ms); Dramatiq doubles it on each retry, with jitter up to 2x
MIN_BACKOFF_MS = 500

URL = os.environ.get("DRAMATIQ_REDIS", "redis://127.0.0.1:6379/0")
SIM_URL = os.environ.get("SIM_URL", "http://127.0.0.1:9000")
dramatiq.set_broker(RedisBroker(url=URL))  # type: ignore[no-untyped-call]  # untyped upstream
PROVIDER = ConcurrentRateLimiter(RedisBackend(url=URL), "provider", limit=CAP)  # type: ignore[no-untyped-call]

_local = threading.local()


def _client() -> httpx.Client:
    """One keep-alive client per worker thread."""
    client = getattr(_local, "client", None)
    if client is None:
        client = _local.client = httpx.Client(timeout=30.0)
    return client


@dramatiq.actor(actor_name=ACTOR, min_backoff=MIN_BACKOFF_MS)
def generate(tag: str, n: int) -> None:
    with PROVIDER.acquire():
        response = _client().post(
            f"{SIM_URL}/generate",
            json={"tag": tag, "n": n},
            headers={"Idempotency-Key": f"{tag}-{n}"},
        )
    response.raise_for_status()
