"""The Message Batches API's state in the simulator: its batches and the charges of their
requests (the routes are floodway/providers/sim/anthropic/routes.py's).

A batch holds for ``hold_s``: its requests are answered one after another over that time,
request ``i`` of ``n`` at ``(i + 1) / n`` of it, so a batch cancelled halfway has answered about
half of them (billed, in its results as ``succeeded``) and the rest are ``canceled`` (not
billed). A cancelled batch is ``canceling`` until the clock moves on, then ended. Each
answered request is billed at the batch price (half the sync price, as Anthropic bills it).
A request Anthropic would refuse is ``errored`` with an ``invalid_request_error``, not
billed. Time is the simulator's clock (a test's fake clock). The ledger also says the most
requests held enqueued at once (in batches not ended): what a batch queue limit counts."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from floodway.providers.sim.anthropic.wire import check, message, rfc3339
from floodway.providers.sim.openai.desk import DeskBooks, LineCharge
from floodway.providers.sim.openai.wire import dumps

#: Anthropic's limit of one batch
MAX_REQUESTS = 100_000
#: a batch not ended by then expires
EXPIRES_S = 86_400.0


@dataclass
class MessageBatch:
    id: str
    requests: list[dict[str, Any]]
    created_at: float
    processing_status: str = "in_progress"
    ended_at: float | None = None
    cancel_initiated_at: float | None = None
    #: the results, one JSON line per request, once it ended
    results: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def as_dict(self, base_url: str) -> dict[str, Any]:
        ended = self.processing_status == "ended"
        counts = {"processing": 0 if ended else len(self.requests), "succeeded": 0,
                  "errored": 0, "canceled": 0, "expired": 0, **self.counts}  # fmt: skip
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.processing_status,
            "request_counts": counts,
            "ended_at": None if self.ended_at is None else rfc3339(self.ended_at),
            "created_at": rfc3339(self.created_at),
            "expires_at": rfc3339(self.created_at + EXPIRES_S),
            "archived_at": None,
            "cancel_initiated_at": None
            if self.cancel_initiated_at is None
            else rfc3339(self.cancel_initiated_at),
            "results_url": f"{base_url}v1/messages/batches/{self.id}/results" if ended else None,
        }


@dataclass
class MessageBatchDesk(DeskBooks):
    clock: Callable[[], float]
    hold_s: float = 0.0
    batches: dict[str, MessageBatch] = field(default_factory=dict)

    def reset(self) -> None:
        super().reset()
        self.batches.clear()

    def create(self, requests: list[dict[str, Any]]) -> MessageBatch:
        """A new batch, its requests counted with those of the batches not ended by now."""
        for held in self.batches.values():
            self.advance(held)
        batch = MessageBatch(f"msgbatch_{uuid.uuid4().hex[:24]}", requests, self.clock())
        self.batches[batch.id] = batch
        self.created.append(batch.id)
        self.advance(batch)
        self.note_enqueued(
            sum(len(b.requests) for b in self.batches.values() if b.processing_status != "ended")
        )
        return batch

    def advance(self, batch: MessageBatch) -> None:
        """Bring ``batch`` up to the clock: at its hold's end, every request answered; once
        the clock moved on from a cancel, those answered by then."""
        now = self.clock()
        asked = batch.cancel_initiated_at
        if batch.processing_status == "in_progress" and now >= batch.created_at + self.hold_s:
            self._end(batch, len(batch.requests), "expired")
        elif batch.processing_status == "canceling" and asked is not None and now > asked:
            total = len(batch.requests)
            elapsed = max(0.0, asked - batch.created_at)
            done = total if self.hold_s <= 0 else min(total, int(total * elapsed / self.hold_s))
            self._end(batch, done, "canceled")

    def cancel(self, batch: MessageBatch) -> None:
        """As Anthropic cancels: ``canceling`` at once, ended later (once the clock moved)."""
        if batch.processing_status == "in_progress":
            batch.cancel_initiated_at = self.clock()
            batch.processing_status = "canceling"

    def _end(self, batch: MessageBatch, answered: int, rest: str) -> None:
        counts = {"succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        for n, request in enumerate(batch.requests):
            custom_id = str(request.get("custom_id"))
            params = request.get("params")
            result: dict[str, Any]
            if n >= answered:
                result = {"type": rest}
            elif (why := check(params)) is not None:
                error = {"type": "error", "error": {"type": "invalid_request_error",
                                                    "message": why}}  # fmt: skip
                result = {"type": "errored", "error": error}
            else:
                assert isinstance(params, dict)  # check() passed
                answer = message(params, f"msg_{batch.id}_{n}")
                usage = answer["usage"]
                self.charges.append(LineCharge(
                    batch.id, custom_id, usage["input_tokens"], usage["output_tokens"]
                ))  # fmt: skip
                result = {"type": "succeeded", "message": answer}
            counts[result["type"]] += 1
            batch.results.append(dumps({"custom_id": custom_id, "result": result}))
        batch.counts = counts
        batch.processing_status = "ended"
        batch.ended_at = self.clock()
