"""Fakes that ship with floodway, for its own tests and for yours.

- :class:`FakeClock`: the engine reads time only through a clock; this one moves only when
  you call :meth:`FakeClock.advance`.
- :class:`SimulatedProvider`: an in-process stand-in for a billed provider, with latency, an
  error mix and a charge ledger keyed by idempotency key (it honours the key, as real
  providers do, so the same work is billed once).
- :func:`sever`: cut a ``Floodway`` off its ledger as SIGKILL would, to test recovery in
  one process.
- :func:`settle`: let the event loop run what is ready (a few rounds), without sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from floodway.app import Floodway
from floodway.context import Context
from floodway.core.errors import FatalError, InvalidOutput, RetryableError
from floodway.store.postgres import PostgresStore
from floodway.store.postgres.sql import Q
from floodway.store.sqlite import SqliteStore

__all__ = ["FakeClock", "SimulatedProvider", "settle", "sever"]


async def _sever_postgres(store: PostgresStore, timeout_s: float = 5.0) -> None:
    """The server frees the session's lock and keeps the process's row (a clean close also
    deletes the row, which peers read as "never judged", not as dead). Returns once a peer
    finds the process dead, a moment after the session closed, as after a SIGKILL."""
    feed, pool = store._feed, store._pool
    if feed is None or pool is None:
        return
    probe = await store._connect()
    try:
        store._feed, store._pool = None, None  # every later read and write is refused
        await pool.close()
        await feed.stop(forget=False)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while loop.time() < end:
            found = await probe.execute(Q["dead_processes"], {"identities": [store.identity]})
            if await found.fetchall():
                return
            await asyncio.sleep(0.001)
        raise RuntimeError(f"the server kept {store.identity}'s session alive {timeout_s:g} s")
    finally:
        await probe.close()


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._ids), fut))
        await fut

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper that is due, in order."""
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            at, _, fut = heapq.heappop(self._sleepers)
            if fut.done():  # its sleeper was cancelled (a wait that ended first): none to wake
                continue
            self._now = max(self._now, at)
            fut.set_result(None)
            await settle()
        self._now = target
        await settle()

    async def jump(self, seconds: float) -> None:
        """Move time forward at once: every sleeper due wakes once, late, as in a process
        the machine paused. Hours pass in one step, where :meth:`advance` would wake a loop
        that sleeps a second thousands of times."""
        self._now += seconds
        due = []
        while self._sleepers and self._sleepers[0][0] <= self._now:
            due.append(heapq.heappop(self._sleepers)[2])
        for fut in due:  # in the order they were due, all in one round of the loop
            if not fut.done():
                fut.set_result(None)
        await settle()


async def settle(rounds: int = 20) -> None:
    """Let every ready coroutine run (thread hops to SQLite included) before going on."""
    for _ in range(rounds):
        await asyncio.sleep(0.001)


@dataclass
class SimulatedProvider:
    """A fake billed provider. Use ``provider.handler`` as a kind's handler, and
    ``provider.lookup`` as its lookup for crash recovery."""

    latency_s: float = 0.0
    jitter: float = 0.0
    error_rate: float = 0.0  # 5xx-like: retryable
    throttle_rate: float = 0.0  # 429: retryable, throttled
    fatal_rate: float = 0.0  # refusals: fatal
    malformed_rate: float = 0.0  # 2xx with unusable output
    seed: int | None = None
    ledger: Counter[str] = field(default_factory=Counter)
    results: dict[str, Any] = field(default_factory=dict)
    calls: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    async def handler(self, ctx: Context, value: Any) -> Any:
        self.calls += 1
        key = ctx.work_key
        if key in self.results:  # an idempotent replay: the provider does not bill again
            return self.results[key]
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.latency_s:
                spread = self.latency_s * self.jitter
                await asyncio.sleep(self.latency_s + self._rng.uniform(-spread, spread))
            roll = self._rng.random()
            forced = value.get("fail") if isinstance(value, dict) else None
            if forced == "5xx" or roll < self.error_rate:
                raise RetryableError(
                    "simulated 503 Service Unavailable", type="http_503", status=503
                )
            roll -= self.error_rate
            if forced == "429" or roll < self.throttle_rate:
                raise RetryableError("simulated 429", retry_after=1.0, throttled=True, status=429)
            roll -= self.throttle_rate
            if forced == "refusal" or roll < self.fatal_rate:
                raise FatalError(
                    "simulated content policy refusal", type="content_policy", status=400
                )
            roll -= self.fatal_rate
            self.ledger[key] += 1
            if forced == "malformed" or roll < self.malformed_rate:
                raise InvalidOutput("simulated malformed output")
            result = {"url": f"https://sim.invalid/{key[:16]}.png", "echo": value}
            self.results[key] = result
            return result
        finally:
            self.in_flight -= 1

    async def lookup(self, ctx: Context) -> Any:
        return self.results.get(ctx.work_key)

    @property
    def double_charged(self) -> list[str]:
        return [k for k, n in self.ledger.items() if n > 1]


async def sever(fw: Floodway) -> None:
    """Cut ``fw`` off its ledger as SIGKILL would cut its process: from now on nothing it does
    reaches the ledger (a closed store refuses every read and write), and its liveness lock is
    free as the kernel or the database server frees it, so peers see it dead. Then tear its
    workers down (their writes fail) and close it."""
    store = fw.store
    if isinstance(store, SqliteStore) and store._liveness is not None:
        # The kernel frees the lock and leaves the file; a clean close also deletes the file,
        # which peers read as "never judged", not as dead.
        os.close(store._liveness)
        store._liveness = None
    if isinstance(store, PostgresStore):
        await _sever_postgres(store)
    await store.close()
