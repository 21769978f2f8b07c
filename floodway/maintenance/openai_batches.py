"""Ending OpenAI-compatible batches: once every task of a batch has ended, its output file
(the successes) and error file (the rest) are written from the tasks' results and the batch
is marked ``completed``, ``cancelled`` or ``expired``, once (a compare-and-set on its status),
whichever process gets there first. Maintenance does it within a sweep of the last task's
end, so results are copied before retention clears them; a read of the batch does it at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from floodway.core.states import Status
from floodway.core.task import Task, new_id
from floodway.runtime import Runtime
from floodway.store.base import OpenAIBatch, StoredFile, TaskQuery
from floodway.wire.openai import error_line, output_line

SUCCESS = (Status.SUCCEEDED, Status.DEDUPED)
#: tasks read per page, batches ended per sweep
PAGE = 1000
PER_SWEEP = 20


class BatchEnder:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def run_once(self) -> int:
        """End the batches whose tasks have all ended; how many."""
        ended = await self.runtime.openai_records.ended_openai_batches(PER_SWEEP)
        for batch in ended:
            await self.end(batch)
        return len(ended)

    async def tasks(self, batch: OpenAIBatch) -> list[Task]:
        tasks: list[Task] = []
        while True:
            after = tasks[-1].seq if tasks else None
            query = TaskQuery(tenant=batch.tenant, batch_id=batch.id, after_seq=after, limit=PAGE)
            page = await self.runtime.store.list_tasks(query)
            tasks.extend(page)
            if len(page) < PAGE:
                return tasks

    async def end(self, batch: OpenAIBatch) -> bool:
        """Write the files and end the batch; False if another process ended it first, or
        if a call of it is still read to its end (a line cancelled mid-call is answered in
        the output file when the provider answered it: it was billed)."""
        tasks = await self.tasks(batch)
        if any(t.lease_token is not None for t in tasks):
            return False
        now = self.runtime.clock.now()
        good = [t for t in tasks if answered(t)]
        bad = [t for t in tasks if not answered(t)]
        output = _file(batch, "output", map(output_line, good), now) if good else None
        errors = _file(batch, "errors", map(error_line, bad), now) if bad else None
        if batch.status == "cancelling":
            status = "cancelled"
        elif now >= batch.expires_at and any(t.status is Status.TIMEOUT for t in tasks):
            status = "expired"  # the window ended first: the rest is in the error file
        else:
            status = "completed"
        records = self.runtime.openai_records
        return await records.end_openai_batch(batch.id, batch.status, status, output, errors, now)


def answered(task: Task) -> bool:
    """Whether a line of a batch has the provider's answer: it succeeded, or it was cancelled
    or timed out while its call, read to its end, succeeded (and was billed)."""
    return task.status in SUCCESS or task.result is not None


def _file(
    batch: OpenAIBatch, what: str, lines: Iterable[dict[str, Any]], now: float
) -> tuple[StoredFile, bytes]:
    content = b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)
    stored = StoredFile(
        id=new_id(now, prefix="file"),
        tenant=batch.tenant,
        purpose="batch_output",
        filename=f"{batch.id}_{what}.jsonl",
        bytes=len(content),
        created_at=now,
    )
    return stored, content
