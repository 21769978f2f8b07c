"""The Redis limiter backend: the primitives of :mod:`floodway.limits.backend` as Lua scripts, so
every worker and API process on every host shares one set of limits (the fleet mode).

Keys are ``floodway:{<prefix>}:<key>``. The braces are a Redis Cluster hash tag: all of one
deployment's keys land in one slot, so a multi-key script (one acquire spans a resource's
buckets, its slots and a tenant's slots) stays legal on a cluster.

Any Redis failure (refused connection, timeout, a replica in failover) surfaces as
:class:`~floodway.limits.backend.LimiterUnavailable`, never as a redis-py exception: the
dispatcher fails closed on it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from floodway.core.errors import LimiterUnavailable
from floodway.limits import redis_scripts as lua
from floodway.limits.backend import (
    RECOVERING,
    AcquireRequest,
    AcquireResult,
    Bucket,
    Meter,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Fail fast: a limiter that hangs stalls every dispatch; one that errors lets the worker back
#: off and fail closed. Used by :meth:`RedisLimiterBackend.from_url`.
DEFAULT_TIMEOUT_S = 2.0

#: After Redis lost its state, admissions wait this long so that every live holder of a lost
#: slot takes it again first. Workers renew their slots with each heartbeat (at most 2 s
#: apart), so two heartbeats fit: the pause costs every worker its admissions, keep it short.
DEFAULT_RECOVERY_S = 4.0

EPOCH = "epoch"  # the key of the state's generation (see redis_scripts)


class RedisLimiterBackend:
    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str = "default",
        *,
        owns_client: bool = False,
        recovery_s: float = DEFAULT_RECOVERY_S,
    ) -> None:
        self._redis = client
        self._ns = f"floodway:{{{prefix}}}:"
        self._owns_client = owns_client
        self._recovery_ms = recovery_s * 1000
        self._epoch = 0.0  # the last generation of the state this process saw (0: none yet)
        self._acquire = client.register_script(lua.ACQUIRE)
        self._settle = client.register_script(lua.SETTLE)
        self._clamp = client.register_script(lua.CLAMP)
        self._level = client.register_script(lua.LEVEL)
        self._renew = client.register_script(lua.RENEW_SLOT)
        self._in_use = client.register_script(lua.SLOTS_IN_USE)
        self._hold = client.register_script(lua.HOLD_SLOT)
        self._estimates = client.register_script(lua.ESTIMATES)
        self._cut = client.register_script(lua.CUT)
        self._grow = client.register_script(lua.GROW)
        self._tick = client.register_script(lua.TICK)
        self._pause = client.register_script(lua.PAUSE)

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = "default",
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int = 64,
        recovery_s: float = DEFAULT_RECOVERY_S,
    ) -> RedisLimiterBackend:
        # A blocking pool: a burst of concurrent calls waits (up to timeout_s) for a connection
        # instead of failing with "Too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=_stale_connection_retry(),
        )
        client = aioredis.Redis.from_pool(pool)
        return cls(client, prefix, owns_client=True, recovery_s=recovery_s)

    @property
    def client(self) -> aioredis.Redis:
        return self._redis

    def key(self, name: str) -> str:
        """The Redis key behind a backend key (for tests and operators)."""
        return self._ns + name

    async def now(self) -> float:
        seconds, micros = await self._call(self._redis.time())
        return float(seconds) + float(micros) / 1e6

    async def acquire(self, request: AcquireRequest) -> AcquireResult:
        names = [RECOVERING, *request.gates, *(s.key for s in request.slots)]
        names += [d.bucket.key for d in request.debits]
        meter = request.meter
        args: list[str | float | int] = [
            self._epoch,
            self._recovery_ms,
            len(request.gates) + 1,
            len(request.slots),
            len(request.debits),
            0 if meter is None else meter.tau_s * 1000,
        ]
        for s in request.slots:
            args += [s.limit, s.slot_id, s.ttl_s * 1000, s.replaces]
        for d in request.debits:
            args += [d.bucket.capacity, d.bucket.refill_per_s, d.cost, d.lag_s]
        keys = [self.key(n) for n in (EPOCH, *names)]
        if meter is not None:
            keys.append(self.key(meter.key))
        reply = await self._script(self._acquire, keys, args)
        at = float(reply[1]) / 1000
        epoch = self._saw_epoch(float(reply[3]))
        if int(reply[0]) == 1:
            return AcquireResult(True, at, epoch=epoch, in_use=tuple(int(n) for n in reply[5:]))
        wait_ms = float(reply[2])
        n_refused = int(reply[4])
        indexes = [int(i) - 1 for i in reply[5:]]
        return AcquireResult(
            granted=False,
            at=at,
            refused=tuple(names[i] for i in indexes[:n_refused]),
            held=tuple(names[i] for i in indexes[n_refused:]),
            retry_in=None if wait_ms < 0 else wait_ms / 1000,
            epoch=epoch,
        )

    async def settle(self, bucket: Bucket, delta: float) -> float:
        reply = await self._script(self._settle, [self.key(bucket.key)], [*_spec(bucket), delta])
        return float(reply)

    async def clamp(self, bucket: Bucket, ceiling: float) -> float:
        reply = await self._script(self._clamp, [self.key(bucket.key)], [*_spec(bucket), ceiling])
        return float(reply)

    async def level(self, bucket: Bucket) -> float:
        return float(await self._script(self._level, [self.key(bucket.key)], _spec(bucket)))

    async def release_slot(self, key: str, slot_id: str) -> bool:
        removed: int = await self._call(self._redis.zrem(self.key(key), slot_id))
        return removed > 0

    async def renew_slot(
        self, key: str, slot_id: str, ttl_s: float, *, taken_in: float = 0.0
    ) -> bool:
        keys = [self.key(key), self.key(EPOCH), self.key(RECOVERING)]
        args: list[str | float | int] = [
            slot_id,
            ttl_s * 1000,
            self._epoch,
            taken_in,
            self._recovery_ms,
        ]
        held, epoch = await self._script(self._renew, keys, args)
        self._saw_epoch(float(epoch))
        return int(held) == 1

    async def hold_slot(self, key: str, slot_id: str, ttl_s: float) -> None:
        await self._script(self._hold, [self.key(key)], [slot_id, ttl_s * 1000])

    async def slots_in_use(self, key: str) -> int:
        return int(await self._script(self._in_use, [self.key(key)], []))

    async def estimates(self, key: str, meter: Meter | None = None) -> dict[str, float]:
        tau_ms = 0.0 if meter is None else meter.tau_s * 1000
        flat = await self._script(self._estimates, [self.key(key)], [tau_ms])
        return {_text(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def cut(
        self, key: str, field: str, value: float, *, floor: float, granted_at: float
    ) -> float:
        args: list[str | float | int] = [field, value, floor, granted_at * 1000]
        return float(await self._script(self._cut, [self.key(key)], args))

    async def grow(
        self,
        key: str,
        field: str,
        *,
        start: float,
        step: float,
        cap: float,
        interval_s: float,
        quiet_s: float = 0.0,
    ) -> float:
        # Lua reads no infinity: an unbounded estimate is capped by a number it never reaches.
        capped = min(cap, _UNBOUNDED)
        args: list[str | float | int] = [
            field,
            start,
            step,
            capped,
            interval_s * 1000,
            quiet_s * 1000,
        ]
        grown = float(await self._script(self._grow, [self.key(key)], args))
        return cap if grown >= _UNBOUNDED else grown

    async def note(self, key: str, fields: dict[str, float]) -> None:
        if fields:
            mapping: dict[FieldT, EncodableT] = {n: _arg(v) for n, v in fields.items()}
            await self._call(self._redis.hset(self.key(key), mapping=mapping))
            await self._call(self._redis.pexpire(self.key(key), ESTIMATES_TTL_MS))

    async def tick(self, meter: Meter, field: str) -> None:
        await self._script(self._tick, [self.key(meter.key)], [field, meter.tau_s * 1000])

    async def pause(self, key: str, seconds: float) -> float:
        added = await self._script(self._pause, [self.key(key)], [seconds * 1000])
        return float(added) / 1000

    async def paused_for(self, key: str) -> float:
        left: int = await self._call(self._redis.pttl(self.key(key)))
        return max(0, left) / 1000

    async def aclose(self) -> None:
        if self._owns_client:
            await self._redis.aclose()

    # -- plumbing ---------------------------------------------------------------------------
    def _saw_epoch(self, epoch: float) -> float:
        if self._epoch and epoch != self._epoch:
            log.warning(
                "the limiter's Redis lost its state (restarted without persistence?): "
                "admissions pause %.0f s while running calls take their slots again",
                self._recovery_ms / 1000,
            )
        self._epoch = epoch
        return epoch

    async def _script(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | float | int]
    ) -> Any:
        return await self._call(script(keys=keys, args=[_arg(a) for a in args]))

    async def _call(self, pending: Awaitable[T]) -> T:
        try:
            return await pending
        except (RedisError, OSError) as exc:
            raise LimiterUnavailable(f"the limiter's Redis is unavailable: {exc}") from exc


def _stale_connection_retry() -> Retry:
    """One immediate retry on a new connection when the pooled one turns out dead.

    After Redis restarts, every connection idle in the pool still looks open; without a retry
    the first command on each fails -- and when that command was a slot release, the slot
    stays held until its TTL (and its task cannot be admitted again until then). Only
    ConnectionError is retried: on a pooled connection it almost always means the command
    never reached the server now answering. (Were a live server's connection cut after it ran
    a script, the scripts run twice are harmless -- a second acquire is refused as ``held``,
    releases, renewals, pauses and clamps are idempotent -- but for a refund, counted twice.)
    A TimeoutError is not retried: the server may still be running the first call."""
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


_UNBOUNDED = 1e300
#: an estimates hash untouched this long is forgotten (the scripts give it the same TTL)
ESTIMATES_TTL_MS = 86_400_000


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _spec(bucket: Bucket) -> list[str | float | int]:
    return [bucket.capacity, bucket.refill_per_s]


def _arg(value: str | float | int) -> str:
    # repr() of a float round-trips exactly; Lua's tonumber reads it back.
    return value if isinstance(value, str) else repr(float(value))
