"""The OpenAI-compatible Batch API's records in the ledger: uploaded and written files, and
batches (each a floodway batch: its tasks carry its id). :class:`OpenAIRecords` is what the
OpenAI routes and the batches' maintenance use, apart from the core
:class:`~floodway.store.base.Store`; every ledger keeps them (:class:`LedgerOpenAIRecords`),
over the same two backends' primitives as the task verbs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from floodway.core.task import NewTask, Submitted
from floodway.store import rules
from floodway.store.access import LedgerAccess
from floodway.store.base import OpenAIBatch, StoredFile, TaskChange
from floodway.store.steps import Row, Rule, count


class OpenAIRecords(Protocol):
    async def put_file(self, file: StoredFile, content: bytes) -> None: ...

    async def get_file(self, file_id: str, tenant: str) -> StoredFile | None: ...

    async def list_files(
        self, tenant: str, purpose: str | None, after: str | None, limit: int
    ) -> list[StoredFile]:
        """Newest first; ``after``: the last id of the previous page."""
        ...

    async def file_content(self, file_id: str, tenant: str) -> bytes | None: ...

    async def delete_file(self, file_id: str, tenant: str) -> bool: ...

    async def submit_openai_batch(
        self, batch: OpenAIBatch, tasks: Sequence[NewTask], now: float
    ) -> list[Submitted]:
        """The batch's row and all its tasks in one transaction, or nothing."""
        ...

    async def get_openai_batch(self, batch_id: str, tenant: str) -> OpenAIBatch | None: ...

    async def list_openai_batches(
        self, tenant: str, after: str | None, limit: int
    ) -> list[OpenAIBatch]:
        """Newest first; ``after``: the last id of the previous page."""
        ...

    async def ended_openai_batches(self, limit: int) -> list[OpenAIBatch]:
        """Batches in progress or cancelling whose tasks have all ended."""
        ...

    async def cancel_openai_batch(self, batch_id: str, tenant: str, now: float) -> bool:
        """in_progress -> cancelling; False when the batch was not in progress."""
        ...

    async def end_openai_batch(
        self,
        batch_id: str,
        expected: str,
        status: str,
        output: tuple[StoredFile, bytes] | None,
        errors: tuple[StoredFile, bytes] | None,
        now: float,
    ) -> bool:
        """``expected`` -> ``status`` with its output and error files, in one transaction;
        False (and no file written) when another process ended the batch first."""
        ...


class LedgerOpenAIRecords(LedgerAccess):
    """:class:`OpenAIRecords` over a ledger's reads and writes."""

    async def put_file(self, file: StoredFile, content: bytes) -> None:
        await self._write(lambda _: _insert_file(file, content))

    async def get_file(self, file_id: str, tenant: str) -> StoredFile | None:
        row = await self._one("get_openai_file", id=file_id, tenant=tenant)
        return None if row is None else StoredFile(**row)

    async def list_files(
        self, tenant: str, purpose: str | None, after: str | None, limit: int
    ) -> list[StoredFile]:
        params = {"tenant": tenant, "purpose": purpose, "after": after, "limit": limit}
        return [StoredFile(**r) for r in await self._all("list_openai_files", **params)]

    async def file_content(self, file_id: str, tenant: str) -> bytes | None:
        row = await self._one("openai_file_content", id=file_id, tenant=tenant)
        return None if row is None else bytes(row["content"])

    async def delete_file(self, file_id: str, tenant: str) -> bool:
        params = {"id": file_id, "tenant": tenant}
        return bool(await self._write(lambda _: count("delete_openai_file", **params)))

    async def submit_openai_batch(
        self, batch: OpenAIBatch, tasks: Sequence[NewTask], now: float
    ) -> list[Submitted]:
        def rule(changes: list[TaskChange]) -> Rule[list[Submitted]]:
            (submitted,) = yield from rules.submit([rules.Submission(tasks, now)], changes)
            yield from count("insert_openai_batch", **_batch_params(batch))
            return submitted

        return await self._write(rule)

    async def get_openai_batch(self, batch_id: str, tenant: str) -> OpenAIBatch | None:
        row = await self._one("get_openai_batch", id=batch_id, tenant=tenant)
        return None if row is None else _batch(row)

    async def list_openai_batches(
        self, tenant: str, after: str | None, limit: int
    ) -> list[OpenAIBatch]:
        rows = await self._all("list_openai_batches", tenant=tenant, after=after, limit=limit)
        return [_batch(r) for r in rows]

    async def ended_openai_batches(self, limit: int) -> list[OpenAIBatch]:
        return [_batch(r) for r in await self._all("ended_openai_batches", limit=limit)]

    async def cancel_openai_batch(self, batch_id: str, tenant: str, now: float) -> bool:
        params = {"id": batch_id, "tenant": tenant, "now": now}
        return bool(await self._write(lambda _: count("cancel_openai_batch", **params)))

    async def end_openai_batch(
        self,
        batch_id: str,
        expected: str,
        status: str,
        output: tuple[StoredFile, bytes] | None,
        errors: tuple[StoredFile, bytes] | None,
        now: float,
    ) -> bool:
        files = [f for f in (output, errors) if f is not None]

        def rule(_: list[TaskChange]) -> Rule[bool]:
            changed = yield from count(
                "end_openai_batch",
                id=batch_id,
                expected=expected,
                status=status,
                output_file_id=None if output is None else output[0].id,
                error_file_id=None if errors is None else errors[0].id,
                now=now,
            )
            if changed:
                for file, content in files:
                    yield from _insert_file(file, content)
            return bool(changed)

        return await self._write(rule)


def _insert_file(file: StoredFile, content: bytes) -> Rule[int]:
    return count(
        "insert_openai_file",
        id=file.id,
        tenant=file.tenant,
        purpose=file.purpose,
        filename=file.filename,
        bytes=file.bytes,
        content=content,
        created_at=file.created_at,
    )


def _batch_params(batch: OpenAIBatch) -> dict[str, Any]:
    return {
        "id": batch.id,
        "tenant": batch.tenant,
        "endpoint": batch.endpoint,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "total": batch.total,
        "metadata": None if batch.metadata is None else json.dumps(batch.metadata),
        "created_at": batch.created_at,
        "expires_at": batch.expires_at,
    }


def _batch(row: Row) -> OpenAIBatch:
    values = dict(row)
    values["metadata"] = None if row["metadata"] is None else json.loads(row["metadata"])
    return OpenAIBatch(**values)
