"""Q1's setup: 10 concurrent requests allowed, 500 ms +-20 %, 5 % answered 5xx.

Worker process (C1): ``floodway worker --app bench.apps.q1:fw`` (C3: ``:fw_without_keys``)
with ``FLOODWAY_DATABASE`` and ``SIM_URL`` set; without them importing this module builds
nothing (``fw`` is None).
"""

from __future__ import annotations

import os

from bench.apps.provider import provider_settings
from floodway import Floodway
from floodway.config import KindConfig, ResourceConfig, Settings
from floodway.providers.sim import SimulatorConfig

CAP = 10
LATENCY_MS = 500.0
JITTER = 0.2
ERROR_RATE = 0.05
TASKS = 200
#: the worker may run more tasks than the provider cap: the resource, not the worker, limits
WORKER_CONCURRENCY = 2 * CAP


def simulator(seed: int, latency_ms: float = LATENCY_MS) -> SimulatorConfig:
    return SimulatorConfig(
        latency_ms=latency_ms,
        latency_jitter=JITTER,
        max_concurrency=CAP,
        error_rate=ERROR_RATE,
        seed=seed,
    )


def settings(sim_url: str, database: str, *, keys: bool = True) -> Settings:
    """``keys=False``: the provider ignores Idempotency-Key and has no look-up (C3), and the
    kind's timeout is floodway's default."""
    # headroom 1.0: the cap is exact (a concurrency slot has no window to overshoot).
    resource = ResourceConfig(concurrency=CAP, headroom=1.0)
    if keys:
        return provider_settings(sim_url, database, resource)
    timeout = KindConfig().timeout
    return provider_settings(sim_url, database, resource, keys=False, timeout_s=timeout)


def _from_env(*, keys: bool = True) -> Floodway | None:
    database, sim_url = os.environ.get("FLOODWAY_DATABASE"), os.environ.get("SIM_URL")
    if not database or not sim_url:
        return None
    return Floodway(settings=settings(sim_url, database, keys=keys))


fw = _from_env()
#: C3's worker: the same, for a provider without keys
fw_without_keys = _from_env(keys=False)
