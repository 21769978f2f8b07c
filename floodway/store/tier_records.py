"""The batch tier's records in the ledger: each batch-tier task's line, and the provider
batches they are packed into (core/tiers.py). :class:`TierRecords` is what a task's
:class:`~floodway.context.LineBook` and the batcher (floodway/maintenance/tier_batches.py)
use; every ledger keeps them (:class:`LedgerTierRecords`), over the same two backends'
primitives as the task verbs.

A provider batch's row is written, with its lines assigned to it, before the provider is
asked to create it (``pack``): its id is the provider batch's tag, so a crash between the
provider's "created" and the row's "sent" is mended by finding the batch
(floodway/maintenance/tier_batches.py says how), never by creating another."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from floodway.core.states import TERMINAL
from floodway.core.task import new_id
from floodway.core.tiers import BATCH_ENDED, CREATING, SENT, BatchLine, LineResult
from floodway.store.access import LedgerAccess
from floodway.store.base import TaskChange
from floodway.store.rules import work_needed_sooner
from floodway.store.steps import Row, Rule, all_rows, count, one

ENDED = BATCH_ENDED
_TERMINAL = sorted(status.value for status in TERMINAL)


@dataclass(frozen=True)
class UpstreamBatch:
    id: str
    kind: str
    model: str
    state: str
    provider_id: str | None
    lines: int
    created_at: float
    sent_at: float | None = None
    ended_at: float | None = None
    #: from its row to its end, when it completed (what the batch tier is judged by)
    turnaround: float | None = None


@dataclass(frozen=True)
class LinePool:
    """The queued lines of one kind and model: how many, the oldest's age, the first
    deadline."""

    kind: str
    model: str
    lines: int
    oldest: float
    due: float | None


class TierRecords(Protocol):
    async def add_line(
        self,
        task_id: str,
        kind: str,
        model: str,
        body: dict[str, object],
        deadline_at: float | None,
        now: float,
        batch_by: float,
    ) -> BatchLine | None:
        """The task's line queued (or the line it has already); None, and nothing queued,
        when a task waiting for its work cannot wait for a batch (``batch_by``:
        :meth:`~floodway.kinds.TierPlan.batch_by`)."""
        ...  # fmt: skip

    async def get_line(self, task_id: str) -> BatchLine | None: ...

    async def requeue_line(self, task_id: str, now: float, batch_by: float) -> bool:
        """A failed or withdrawn line queued again for a new batch, unless a task waiting
        for its work cannot wait for one (as :meth:`add_line`)."""
        ...

    async def set_tier(self, task_id: str, tier: str) -> None: ...

    async def pools(self) -> list[LinePool]: ...

    async def queued_due(self, kind: str, by: float) -> list[BatchLine]:
        """Queued lines of ``kind`` whose deadline is at or before ``by``."""
        ...

    async def pack(self, kind: str, model: str, limit: int, now: float) -> UpstreamBatch | None:
        """A new provider batch's row with up to ``limit`` queued lines (the oldest first),
        in one write; None when none were queued."""
        ...

    async def open_batches(self) -> list[UpstreamBatch]: ...

    async def batch_lines(self, batch_id: str) -> list[BatchLine]: ...

    async def sent(self, batch_id: str, provider_id: str, now: float) -> bool: ...

    async def recorded(self, provider_ids: Sequence[str]) -> set[str]:
        """Which of these provider batch ids a row of the ledger holds."""
        ...

    async def end_batch(
        self,
        batch_id: str,
        results: Sequence[LineResult],
        now: float,
        turnaround: float | None = None,
    ) -> list[str]:
        """The batch's answered and failed lines recorded, the rest withdrawn (the batch
        ended without them), the batch ended (``turnaround``: it completed, that long after
        its row was written), and its lines' tasks made due for their poll: one write.
        Returns the tasks' ids."""
        ...

    async def learned_turnarounds(self, recent: int) -> dict[str, list[float]]:
        """Each kind's ``recent`` latest completed batches' turnarounds, the oldest first."""
        ...

    async def withdraw_queued(self, task_ids: Sequence[str], now: float) -> None:
        """Queued lines taken out before their deadline, their tasks made due."""
        ...


class LedgerTierRecords(LedgerAccess):
    """:class:`TierRecords` over a ledger's reads and writes."""

    async def add_line(
        self,
        task_id: str,
        kind: str,
        model: str,
        body: dict[str, object],
        deadline_at: float | None,
        now: float,
        batch_by: float,
    ) -> BatchLine | None:
        params = {"task_id": task_id, "kind": kind, "model": model, "body": json.dumps(body),
                  "state": "queued", "deadline_at": deadline_at, "now": now}  # fmt: skip
        if not await self._write(_unless_needed_sooner(task_id, batch_by, "insert_line", params)):
            return await self.get_line(task_id)  # None, or the line it had already
        line = await self.get_line(task_id)
        assert line is not None
        return line

    async def get_line(self, task_id: str) -> BatchLine | None:
        row = await self._one("get_line", task_id=task_id)
        return None if row is None else _line(row)

    async def requeue_line(self, task_id: str, now: float, batch_by: float) -> bool:
        params = {"task_id": task_id, "queued": "queued", "from_states": ["failed", "withdrawn"],
                  "now": now}  # fmt: skip
        return bool(
            await self._write(_unless_needed_sooner(task_id, batch_by, "requeue_line", params))
        )

    async def set_tier(self, task_id: str, tier: str) -> None:
        await self._write(lambda _: count("set_task_tier", id=task_id, tier=tier))

    async def pools(self) -> list[LinePool]:
        rows = await self._all("line_pools", queued="queued")
        return [LinePool(r["kind"], r["model"], r["lines"], r["oldest"], r["due"]) for r in rows]

    async def queued_due(self, kind: str, by: float) -> list[BatchLine]:
        rows = await self._all("queued_lines_due", queued="queued", kind=kind, by=by)
        return [_line(r) for r in rows]

    async def pack(self, kind: str, model: str, limit: int, now: float) -> UpstreamBatch | None:
        batch_id = new_id(now, prefix="ub")

        def rule(_: list[TaskChange]) -> Rule[int]:
            yield from count(
                "insert_upstream_batch", id=batch_id, kind=kind, model=model, state=CREATING,
                now=now,
            )  # fmt: skip
            yield from count(
                "drop_ended_lines", kind=kind, model=model, queued="queued", ended=_TERMINAL
            )
            packed = yield from count(
                "pack_lines", sent="sent", queued="queued", batch_id=batch_id, kind=kind,
                model=model, limit=limit, now=now,
            )  # fmt: skip
            yield from count("count_batch_lines", id=batch_id)
            return packed

        packed = await self._write(rule)
        if not packed:
            await self._write(lambda _: count("end_upstream_batch", id=batch_id, ended=ENDED,
                                              now=now, turnaround=None))  # fmt: skip
            return None
        return UpstreamBatch(batch_id, kind, model, CREATING, None, packed, now)

    async def open_batches(self) -> list[UpstreamBatch]:
        rows = await self._all("open_upstream_batches", creating=CREATING, sent=SENT)
        return [UpstreamBatch(**dict(r)) for r in rows]

    async def batch_lines(self, batch_id: str) -> list[BatchLine]:
        return [_line(r) for r in await self._all("batch_lines", batch_id=batch_id)]

    async def sent(self, batch_id: str, provider_id: str, now: float) -> bool:
        params = {"id": batch_id, "provider_id": provider_id, "now": now, "sent": SENT,
                  "creating": CREATING}  # fmt: skip
        return bool(await self._write(lambda _: count("sent_upstream_batch", **params)))

    async def recorded(self, provider_ids: Sequence[str]) -> set[str]:
        if not provider_ids:
            return set()
        rows = await self._all("recorded_provider_ids", ids=list(provider_ids))
        return {str(r["provider_id"]) for r in rows}

    async def end_batch(
        self,
        batch_id: str,
        results: Sequence[LineResult],
        now: float,
        turnaround: float | None = None,
    ) -> list[str]:
        rows = [_outcome(batch_id, r, now) for r in results]

        def rule(_: list[TaskChange]) -> Rule[list[str]]:
            for row in rows:
                yield from count("end_line", **row)
            yield from count(
                "withdraw_batch_rest", batch_id=batch_id, withdrawn="withdrawn", sent="sent",
                now=now,
            )  # fmt: skip
            yield from count(
                "end_upstream_batch", id=batch_id, ended=ENDED, now=now, turnaround=turnaround
            )
            lines = yield from all_rows("batch_lines", batch_id=batch_id)
            ids = [str(line["task_id"]) for line in lines]
            if ids:
                yield from count("wake_line_tasks", ids=ids, now=now)
            return ids

        return await self._write(rule, wake=True)

    async def learned_turnarounds(self, recent: int) -> dict[str, list[float]]:
        learned: dict[str, list[float]] = {}
        for row in await self._all("learned_turnarounds", recent=recent):
            learned.setdefault(str(row["kind"]), []).append(float(row["turnaround"]))
        return learned

    async def withdraw_queued(self, task_ids: Sequence[str], now: float) -> None:
        ids = list(task_ids)
        if not ids:
            return

        def rule(_: list[TaskChange]) -> Rule[None]:
            yield from count(
                "withdraw_queued", ids=ids, withdrawn="withdrawn", queued="queued", now=now
            )
            yield from count("wake_line_tasks", ids=ids, now=now)

        await self._write(rule, wake=True)


def _unless_needed_sooner(
    task_id: str, batch_by: float, statement: str, params: dict[str, Any]
) -> Callable[[list[TaskChange]], Rule[int]]:
    """``statement`` queues the task's line, unless a task waiting for its work cannot wait
    for a batch. The work's fingerprint is held meanwhile: a task joining it waits, and then
    finds the line (and takes the work off the batch tier if it must: store/rules.py)."""

    def rule(_: list[TaskChange]) -> Rule[int]:
        task = yield from one("get_task", id=task_id)
        if task is not None and task["fingerprint"] is not None:
            yield from one("lock_fingerprint", fingerprint=task["fingerprint"])
        if (yield from work_needed_sooner(task_id, batch_by)):
            return 0
        return (yield from count(statement, **params))

    return rule


def _outcome(batch_id: str, result: LineResult, now: float) -> dict[str, Any]:
    return {
        "task_id": result.custom_id,
        "batch_id": batch_id,
        "sent": "sent",
        "state": "done" if result.ok else "failed",
        "result": json.dumps(result.result) if result.ok else None,
        "input_tokens": result.input_tokens,
        "output_tokens": result.output_tokens,
        "error": result.error,
        "error_type": result.error_type,
        "fatal": result.fatal,
        "now": now,
    }


def _line(row: Row) -> BatchLine:
    return BatchLine(
        task_id=row["task_id"],
        kind=row["kind"],
        model=row["model"],
        body=json.loads(row["body"]),
        state=row["state"],
        added_at=row["added_at"],
        deadline_at=row["deadline_at"],
        batch_id=row["batch_id"],
        result=None if row["result"] is None else json.loads(row["result"]),
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        error=row["error"],
        error_type=row["error_type"],
        fatal=bool(row["fatal"]),
    )
