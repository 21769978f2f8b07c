"""The Batch API's state in the simulator: its files, batches and the charges of their lines
(the routes are floodway/providers/sim/openai/batches.py's)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from floodway.providers.sim.openai.wire import dumps

#: how a line's body is answered, per endpoint (given by the routes' module)
LineAnswer = Callable[[dict[str, Any], str], dict[str, Any]]

#: what a line costs against the same call on the sync tier
BATCH_DISCOUNT = 0.5
#: OpenAI's limit of one file
MAX_LINES = 50_000
OPEN = ("validating", "in_progress", "finalizing", "cancelling")


@dataclass(frozen=True)
class LineCharge:
    """One billed line: its batch, ``custom_id`` and usage, at the batch price."""

    batch_id: str
    custom_id: str
    input_tokens: int
    output_tokens: int
    discount: float = BATCH_DISCOUNT


def batch_ledger(
    created: list[str], charges: list[LineCharge], most_enqueued: int
) -> dict[str, Any]:
    """What a batch API billed (``GET /ledger``'s ``batch``): its batches, its billed lines
    and their tokens, any custom_id billed twice, and the most lines it held enqueued at
    once (in batches not ended: what a provider's batch queue limit counts)."""
    billed: dict[str, int] = {}
    for charge in charges:
        billed[charge.custom_id] = billed.get(charge.custom_id, 0) + 1
    return {
        "batches": len(created),
        "lines": len(charges),
        "input_tokens": sum(c.input_tokens for c in charges),
        "output_tokens": sum(c.output_tokens for c in charges),
        "discount": BATCH_DISCOUNT,
        "double_charged": sorted(k for k, n in billed.items() if n > 1),
        "custom_ids": sorted(billed),
        "most_enqueued": most_enqueued,
    }


@dataclass(kw_only=True)
class DeskBooks:
    """What a fake batch API billed and held, kept alike by the OpenAI and Anthropic desks."""

    charges: list[LineCharge] = field(default_factory=list)
    #: batches created, in order (a crash test counts them)
    created: list[str] = field(default_factory=list)
    #: the most lines held enqueued at once, in batches not ended
    most_enqueued: int = 0

    def ledger(self) -> dict[str, Any]:
        return batch_ledger(self.created, self.charges, self.most_enqueued)

    def reset(self) -> None:
        self.charges.clear()
        self.created.clear()
        self.most_enqueued = 0

    def note_enqueued(self, lines: int) -> None:
        self.most_enqueued = max(self.most_enqueued, lines)


@dataclass
class Batch:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None
    created_at: float
    lines: list[dict[str, Any]]
    status: str = "in_progress"
    #: how many of its lines were answered (in order), when it ended
    answered: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    ended_at: float | None = None
    cancelled_at: float | None = None
    failed: int = 0

    def as_dict(self) -> dict[str, Any]:
        done = self.answered - self.failed
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": int(self.created_at),
            "in_progress_at": int(self.created_at),
            "completed_at": int(self.ended_at)
            if self.status == "completed" and self.ended_at
            else None,
            "cancelled_at": int(self.cancelled_at) if self.cancelled_at else None,
            "expires_at": int(self.created_at + 86400),
            "request_counts": {"total": len(self.lines), "completed": done, "failed": self.failed},
            "metadata": self.metadata,
        }


@dataclass
class BatchDesk(DeskBooks):
    """The simulator's files and batches, and the charges of their lines."""

    clock: Callable[[], float]
    hold_s: float = 0.0
    answers: dict[str, LineAnswer] = field(default_factory=dict)
    files: dict[str, tuple[dict[str, Any], bytes]] = field(default_factory=dict)
    batches: dict[str, Batch] = field(default_factory=dict)

    def reset(self) -> None:
        super().reset()
        self.files.clear()
        self.batches.clear()

    def enqueue(self, batch: Batch) -> None:
        """A new batch, its lines counted with those of the batches not ended by now."""
        for held in self.batches.values():
            self.advance(held)
        self.batches[batch.id] = batch
        self.created.append(batch.id)
        self.advance(batch)
        self.note_enqueued(sum(len(b.lines) for b in self.batches.values() if b.status in OPEN))

    def advance(self, batch: Batch) -> None:
        """Bring ``batch`` up to the clock: at its hold's end, every line answered."""
        if batch.status == "in_progress" and self.clock() >= batch.created_at + self.hold_s:
            self._end(batch, "completed", len(batch.lines))

    def cancel(self, batch: Batch) -> None:
        if batch.status not in OPEN:
            return
        now = self.clock()
        elapsed = max(0.0, now - batch.created_at)
        total = len(batch.lines)
        answered = total if self.hold_s <= 0 else min(total, int(total * elapsed / self.hold_s))
        batch.cancelled_at = now
        self._end(batch, "cancelled", answered)

    def _end(self, batch: Batch, status: str, answered: int) -> None:
        answer = self.answers[batch.endpoint]
        out, errors = [], []
        for n, line in enumerate(batch.lines[:answered]):
            custom_id = str(line.get("custom_id"))
            given = line.get("body")
            body: dict[str, Any] = given if isinstance(given, dict) else {}
            request_id = f"req_{batch.id}_{n}"
            fail = (body.get("metadata") or {}).get("fail") if isinstance(body, dict) else None
            if fail in ("5xx", "refusal"):
                code = 500 if fail == "5xx" else 400
                reason = "server_error" if code == 500 else "content_policy_violation"
                response = {
                    "status_code": code,
                    "request_id": request_id,
                    "body": {"error": {"message": reason, "type": reason, "code": reason}},
                }
                errors.append(
                    {
                        "id": f"batch_req_{n}",
                        "custom_id": custom_id,
                        "response": response,
                        "error": None,
                    }
                )
                batch.failed += 1
                continue
            whole = answer(body, f"{batch.id}-{n}")
            usage = whole.get("usage", {})
            self.charges.append(
                LineCharge(
                    batch.id,
                    custom_id,
                    int(usage.get("prompt_tokens", 0)),
                    int(usage.get("completion_tokens", 0)),
                )
            )
            response = {"status_code": 200, "request_id": request_id, "body": whole}
            out.append(
                {
                    "id": f"batch_req_{n}",
                    "custom_id": custom_id,
                    "response": response,
                    "error": None,
                }
            )
        batch.answered = answered
        batch.status = status
        batch.ended_at = self.clock()
        if out:
            batch.output_file_id = self._put("batch_output", f"{batch.id}_output.jsonl", out)
        if errors:
            batch.error_file_id = self._put("batch_output", f"{batch.id}_errors.jsonl", errors)

    def _put(self, purpose: str, name: str, lines: list[dict[str, Any]]) -> str:
        content = "".join(dumps(line) + "\n" for line in lines).encode()
        return self.add_file(purpose, name, content)

    def add_file(self, purpose: str, name: str, content: bytes) -> str:
        file_id = f"file_{uuid.uuid4().hex[:24]}"
        meta = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(self.clock()),
            "filename": name,
            "purpose": purpose,
        }
        self.files[file_id] = (meta, content)
        return file_id
