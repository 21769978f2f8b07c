"""What a handler gets besides its input."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from floodway.clock import Clock
from floodway.core.spend import Usage
from floodway.core.task import Task
from floodway.core.tiers import BatchLine

#: Record an upstream job id durably for this attempt; False when the attempt lost its lease.
RecordRef = Callable[[str], Awaitable[bool]]
#: Keep a streamed call's next events with the task, numbered from the first given (with the
#: provider's request id, when the first events bring it).
AppendEvents = Callable[[int, list[str], str | None], Awaitable[None]]


class LineBook(Protocol):
    """This task's line in a provider batch (core/tiers.py), kept in the ledger."""

    async def get(self) -> BatchLine | None:
        """The task's line, None when it has none."""
        ...

    async def add(self, model: str, body: dict[str, object], batch_by: float) -> BatchLine | None:
        """Queue the task's request for the next batch of its kind and model (or, when it
        was queued before, the line as it is: a task has one line). None, nothing queued: a
        task waiting for the same work cannot wait for a batch (it is due before
        ``batch_by``, :meth:`~floodway.kinds.TierPlan.batch_by`, or interactive)."""
        ...

    async def withdraw(self) -> None:
        """A line still queued taken out (its task was cancelled): never sent."""
        ...

    async def requeue(self, batch_by: float) -> bool:
        """A line that failed retryably, or was taken out, queued again for a new batch;
        False, as :meth:`add`'s None."""
        ...

    async def set_tier(self, tier: str) -> None:
        """Record the tier the task's call goes on (the task's ``tier``)."""
        ...


class Context:
    """Per-attempt handle given to a handler.

    ``work_key`` is the same across attempts and across crash recovery: send it upstream as
    the provider's Idempotency-Key so it never bills the same work twice.
    """

    def __init__(
        self,
        task: Task,
        clock: Clock,
        record_ref: RecordRef,
        append_events: AppendEvents | None = None,
        lines: LineBook | None = None,
    ) -> None:
        self.task = task
        #: the task's provider batch line (None: outside a ledger, as in unit tests)
        self.lines = lines
        self._append_events = append_events
        #: events of this attempt's stream handed on so far
        self.streamed = 0
        #: the task was cancelled (or the lease lost): a handler that can stop its call
        #: cleanly may (the provider's cancel endpoint); floodway itself reads the call on
        self.cancelled = asyncio.Event()
        #: another worker holds the task now: this attempt's answer will be dropped
        self.lease_lost = asyncio.Event()
        self._clock = clock
        self._record_ref = record_ref
        self.usage: float | None = None
        #: what the provider billed, for the spend ledger (None: it reported nothing)
        self.billed: Usage | None = None
        self.upstream_ref: str | None = task.upstream_ref
        self.response_headers: dict[str, str] = {}
        #: the provider's id of its last answer to this attempt (kept with the task)
        self.upstream_request_id: str | None = None
        self.throttled = False

    @property
    def task_id(self) -> str:
        return self.task.id

    @property
    def work_key(self) -> str:
        return self.task.work_key

    @property
    def attempt(self) -> int:
        return self.task.attempts

    @property
    def deadline_at(self) -> float | None:
        return self.task.deadline_at

    def now(self) -> float:
        return self._clock.now()

    def report_usage(
        self,
        amount: float,
        *,
        input_tokens: float | None = None,
        output_tokens: float | None = None,
        images: float | None = None,
        tier: str = "sync",
    ) -> None:
        """The actual cost the provider reported (tokens, characters...): settles the
        estimate made at submit. The split (input and output tokens, images) prices the call
        in the spend ledger, at the price of its ``tier``; without one, ``amount`` is priced
        as input tokens."""
        self.usage = float(amount)
        if input_tokens is None and output_tokens is None and images is None:
            self.billed = Usage(input_tokens=self.usage, tier=tier)
        else:
            self.billed = Usage(
                float(input_tokens or 0), float(output_tokens or 0), float(images or 0), tier
            )

    async def stream(self, events: list[str]) -> None:
        """Hand on a streamed call's next events: kept with the task as they come, so every
        client of the same work, in any process, reads them while the call runs."""
        if not events:
            return
        if self._append_events is not None:
            request_id = self.upstream_request_id if self.streamed == 0 else None
            await self._append_events(self.streamed + 1, events, request_id)
        self.streamed += len(events)

    def lose_lease(self) -> None:
        """Fenced: stop working for nobody."""
        self.lease_lost.set()
        self.cancelled.set()

    async def set_upstream_ref(self, ref: str) -> None:
        """Record the upstream job id durably before waiting on it, so recovery can resume
        the job instead of paying for it again."""
        if not await self._record_ref(ref):
            self.lose_lease()
            raise asyncio.CancelledError("lease lost")
        self.upstream_ref = ref
