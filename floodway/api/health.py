"""What the API depends on, each looked at once with a bound: the ledger, and the limiter's
Redis when one is configured. ``/readyz`` answers 503 when one is down (take the process out
of a load balancer's rotation); ``/healthz`` stays a liveness probe and only reports them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from pydantic import BaseModel, Field

from floodway.api.state import ApiState
from floodway.core.errors import FloodwayError
from floodway.store.factory import redact

#: a dependency that has not answered within this is reported down (a probe must not hang)
PROBE_TIMEOUT_S = 2.0
#: an id no task has (ids are ``t_`` + 26 characters): reading it is one index lookup
_PROBE_ID = "t_readiness_probe"


class CheckOut(BaseModel):
    status: Literal["ok", "down"]
    latency_ms: float = Field(description="how long the look took")
    target: str = Field(description="what was looked at (URLs without passwords)")
    detail: str = ""


class ReadyOut(BaseModel):
    status: Literal["ok"]
    version: str
    checks: dict[str, CheckOut]


async def probe(target: str, look: Callable[[], Awaitable[object]]) -> CheckOut:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            await look()
    except TimeoutError:
        detail = f"no answer within {PROBE_TIMEOUT_S:g} s"
    except (FloodwayError, OSError) as exc:
        detail = " ".join(str(exc).split())
    else:
        detail = ""
    latency_ms = round((time.perf_counter() - started) * 1000, 2)
    return CheckOut(
        status="down" if detail else "ok", latency_ms=latency_ms, target=target, detail=detail
    )


async def check_dependencies(state: ApiState) -> dict[str, CheckOut]:
    fw = state.fw

    async def ledger() -> None:
        await fw.store.get(_PROBE_ID)
        # A full disk or a read-only database still reads: ready only while writes land.
        await fw.store.probe_write(fw.clock.now())

    looks = {"ledger": probe(redact(fw.settings.database), ledger)}
    limiter = state.limiter
    if fw.settings.redis and limiter is not None:
        looks["limiter"] = probe(redact(fw.settings.redis), limiter.now)
    results = await asyncio.gather(*looks.values())
    return dict(zip(looks, results, strict=True))
