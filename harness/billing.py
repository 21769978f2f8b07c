"""A billed provider that goes on after floodway hangs up, as real ones do.

:class:`BillingProvider` serves calls in process, on floodway's clock (a ``FakeClock`` in
tests): a call takes ``call_s`` and bills its piece of work when it finishes computing it,
whether or not anyone still waits for the answer (OpenAI, Anthropic and every image or video
API bill what they computed). A client that times out, cancels or dies leaves the call
running here. It keeps what a test of the money invariants needs: the charges per piece of
work, the calls in flight and their peak (with a violation noted above ``cap``), and two calls
of one work at once. It honours ``Idempotency-Key`` (floodway's work key) only if told to, and
answers a look-up by key (:meth:`look_up`) for a kind declared with one.

Use ``provider.call`` as a kind's handler, ``provider.look_up`` as its ``lookup``. The HTTP
simulator (``floodway simulate``, with ``honor_idempotency_key = false`` for a provider
without keys) bills the same way across processes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from floodway import Context, RetryableError
from floodway.clock import Clock


@dataclass(eq=False)
class Call:
    """One call the provider serves, whether or not anyone still listens for its answer."""

    work: str
    key: str
    tenant: str
    ends_at: float
    fails: bool
    answer: asyncio.Future[dict[str, Any]]
    runner: asyncio.Task[None] | None = None


def by_work_key(ctx: Context) -> str:
    """The default name of a piece of work: floodway's work key (the same across attempts)."""
    return ctx.work_key


def never_fails(ctx: Context, call: int) -> bool:
    return False


@dataclass
class BillingProvider:
    clock: Clock
    #: how long the provider computes one call (or a call for ``ctx``)
    call_s: float | Callable[[Context], float] = 1.0
    #: what one finished call bills
    price: float = 0.0
    #: a second call with the same Idempotency-Key joins the first (or replays its answer);
    #: a function: for the calls it says so of
    honours_keys: bool | Callable[[Context], bool] = False
    #: the in-flight limit floodway was configured with: more at once is a violation
    cap: int | None = None
    #: what bills once: the work a call is for (default: its work key)
    work_of: Callable[[Context], str] = by_work_key
    #: (ctx, number of this work's call) -> answer 503 (not billed) instead
    fails: Callable[[Context, int], bool] = never_fails
    charges: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    #: finished answers by key, for replays and look-ups
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: set[Call] = field(default_factory=set)
    peak: int = 0
    violations: list[str] = field(default_factory=list)
    serial: int = 0

    @property
    def in_flight(self) -> int:
        return len(self.running)

    @property
    def billed(self) -> float:
        """What the provider billed, in all."""
        return self.price * sum(self.charges.values())

    def keyed(self, ctx: Context) -> bool:
        """Whether the provider honours ``ctx``'s Idempotency-Key."""
        return self.honours_keys(ctx) if callable(self.honours_keys) else self.honours_keys

    def start(self, ctx: Context) -> Call:
        """Start (or, honouring keys, join) the call for ``ctx``'s work."""
        key = ctx.work_key
        if self.keyed(ctx):
            for call in self.running:
                if call.key == key:  # joined to the call in flight: nothing more is billed
                    return call
        work = self.work_of(ctx)
        if any(call.work == work for call in self.running):
            self.violations.append(f"two calls of {work} at once")
        self.calls[work] += 1
        fails = self.fails(ctx, self.calls[work])
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        ends_at = self.clock.now() + (self.call_s(ctx) if callable(self.call_s) else self.call_s)
        call = Call(work, key, ctx.task.tenant, ends_at, fails, answer)
        self.running.add(call)
        self.peak = max(self.peak, len(self.running))
        if self.cap is not None and len(self.running) > self.cap:
            self.violations.append(f"{len(self.running)} calls in flight, cap {self.cap}")
        call.runner = asyncio.create_task(self._serve(call))
        return call

    async def _serve(self, call: Call) -> None:
        try:
            await self.clock.sleep(call.ends_at - self.clock.now())
        except asyncio.CancelledError:
            call.answer.cancel()
            raise
        finally:
            self.running.discard(call)
        if call.fails:
            call.answer.set_exception(RetryableError("503 Service Unavailable", status=503))
            return
        self.charges[call.work] += 1
        self.serial += 1
        result = {"work": call.work, "tenant": call.tenant, "serial": self.serial}
        self.done[call.key] = result
        call.answer.set_result(result)

    async def call(self, ctx: Context, value: Any = None) -> dict[str, Any]:
        """A kind's handler: the answer of the call, which goes on if the caller goes."""
        if self.keyed(ctx) and ctx.work_key in self.done:
            answer = self.done[ctx.work_key]  # a replay: not billed again
        else:
            call = self.start(ctx)
            call.answer.add_done_callback(_seen)
            try:
                answer = await asyncio.shield(call.answer)
            except asyncio.CancelledError:
                self.hung_up(ctx, call)
                raise
        # the answer says what its call billed, a replay's as the first time (priced per call)
        ctx.report_usage(0)
        return answer

    def hung_up(self, ctx: Context, call: Call) -> None:
        """The caller stopped waiting for ``call``, which goes on: a hook for a model that
        tracks what floodway can no longer see."""

    async def look_up(self, ctx: Context) -> dict[str, Any] | None:
        """The finished answer under ``ctx``'s key, which says what its call billed."""
        found = self.done.get(ctx.work_key)
        if found is not None:
            ctx.report_usage(0)
        return found

    def stop_all(self) -> None:
        """Every call in flight stops unbilled (a provider that stops on disconnect, or went
        down with the client's connections)."""
        for call in list(self.running):
            if call.runner is not None:
                call.runner.cancel()


def _seen(answer: asyncio.Future[dict[str, Any]]) -> None:
    """An answer nobody waits for any more: its failure is not an unretrieved exception."""
    if not answer.cancelled():
        answer.exception()
