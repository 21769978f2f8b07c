"""``/openai/v1/batches``: OpenAI's Batch API over a floodway batch.

Creating a batch reads its input file, checks every line (a bad line is a 400 that names it)
and submits one background task per line, with the batch's row, in one transaction. The
batch is ``in_progress`` while its tasks run; once the last one ended, its files are written
and it ends (:mod:`floodway.maintenance.openai_batches`: by maintenance, or by the first read).
"""

from __future__ import annotations

import contextlib
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from floodway.api.auth import Tenant
from floodway.api.media import JSON_BODY
from floodway.api.problems import ApiProblem
from floodway.api.routes.openai.catalog import json_object, kind_for
from floodway.api.routes.openai.files import jsonl_lines, tenant_file
from floodway.api.state import ApiState, api_state
from floodway.core.errors import FloodwayError, IllegalTransition
from floodway.core.states import TERMINAL, Status
from floodway.core.task import Lane, SubmitRequest, new_id
from floodway.maintenance.openai_batches import SUCCESS, BatchEnder
from floodway.runtime import BatchOf
from floodway.store.base import OpenAIBatch
from floodway.wire.openai import BATCH_URLS, list_page

router = APIRouter()

State = Annotated[ApiState, Depends(api_state)]

WINDOW_S = {"24h": 24 * 3600.0}
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _problem(line: int, detail: str) -> ApiProblem:
    return ApiProblem(
        400, "invalid-batch-line", f"line {line}: {detail}", param="input_file_id", line=line
    )


def _requests(
    state: ApiState, endpoint: str, content: bytes, window_s: float
) -> tuple[list[SubmitRequest], list[int]]:
    """The file's requests and the line each stands on."""
    seen = set[str]()
    requests, numbers = [], []
    for number, line in jsonl_lines(content, state.settings.api.max_json_depth):
        custom_id, body = line.get("custom_id"), line.get("body")
        if not isinstance(custom_id, str) or not custom_id:
            raise _problem(number, "custom_id must be a non-empty string")
        if custom_id in seen:
            raise _problem(number, f"custom_id {custom_id[:100]!r} is used twice")
        seen.add(custom_id)
        if line.get("method", "POST") != "POST" or line.get("url") != endpoint:
            raise _problem(number, f"method must be POST and url {endpoint} (the batch's endpoint)")
        if not isinstance(body, dict):
            raise _problem(number, "body must be a JSON object (the request)")
        if body.get("stream"):
            raise _problem(number, "stream: true has no meaning in a batch")
        try:
            kind = kind_for(state.settings, BATCH_URLS[endpoint], body)
        except ApiProblem as exc:
            raise _problem(number, exc.detail) from None
        metadata = {"custom_id": custom_id}
        requests.append(
            SubmitRequest(kind, body, lane=Lane.BACKGROUND, deadline_s=window_s, metadata=metadata)
        )
        numbers.append(number)
    return requests, numbers


@router.post("/batches", dependencies=[JSON_BODY])
async def create_batch(request: Request, tenant: Tenant, state: State) -> dict[str, Any]:
    body = await json_object(request)
    endpoint, window = body.get("endpoint"), body.get("completion_window")
    if endpoint not in BATCH_URLS:
        raise ApiProblem(
            400,
            "invalid-endpoint",
            f"endpoint must be one of {', '.join(BATCH_URLS)}",
            param="endpoint",
        )
    if window not in WINDOW_S:
        raise ApiProblem(
            400,
            "invalid-completion-window",
            "completion_window must be '24h'",
            param="completion_window",
        )
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items())
    ):
        raise ApiProblem(
            400,
            "invalid-metadata",
            "metadata: at most 16 string values (keys up to 64 characters, values up to 512)",
            param="metadata",
        )
    input_id = body.get("input_file_id")
    source = await tenant_file(state, input_id if isinstance(input_id, str) else "", tenant)
    if source.purpose != "batch":
        raise ApiProblem(
            400,
            "invalid-input-file",
            f"file {source.id} is a batch's {source.purpose}, not an input (purpose batch)",
            param="input_file_id",
        )
    content = await state.fw.openai_records.file_content(source.id, tenant) or b""
    now = state.fw.clock.now()
    requests, numbers = _requests(state, endpoint, content, WINDOW_S[window])
    batch = OpenAIBatch(
        id=new_id(now, prefix="batch"),
        tenant=tenant,
        endpoint=endpoint,
        input_file_id=source.id,
        completion_window=window,
        status="in_progress",
        total=len(requests),
        created_at=now,
        expires_at=now + WINDOW_S[window],
        metadata=metadata,
    )

    def refuse(index: int, exc: FloodwayError) -> ApiProblem:
        return _problem(numbers[index], str(exc))

    await state.fw.runtime.submit(
        requests,
        tenant=tenant,
        gate=state.gate,
        batch=BatchOf(batch.id, openai=batch, refuse_item=refuse),
    )
    return await _current(state, batch)


async def _found(state: ApiState, batch_id: str, tenant: str) -> OpenAIBatch:
    records = state.fw.openai_records
    found = await records.get_openai_batch(batch_id, tenant) if _ID.fullmatch(batch_id) else None
    if found is None:
        raise ApiProblem(404, "batch-not-found", f"no batch {batch_id[:64]!r}", param="batch_id")
    return found


@router.get("/batches/{batch_id}")
async def get_batch(batch_id: str, tenant: Tenant, state: State) -> dict[str, Any]:
    return await _current(state, await _found(state, batch_id, tenant))


@router.get("/batches")
async def list_batches(
    tenant: Tenant,
    state: State,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64, pattern=_ID.pattern)] = None,
) -> dict[str, Any]:
    found = await state.fw.openai_records.list_openai_batches(tenant, after, limit + 1)
    return list_page([await _current(state, b) for b in found[:limit]], len(found) > limit)


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, tenant: Tenant, state: State) -> dict[str, Any]:
    """Queued and retrying requests are cancelled at once; running ones are read to their end
    (an answered line is billed and kept in the output); ``cancelled`` once all ended."""
    fw = state.fw
    batch = await _found(state, batch_id, tenant)
    if batch.status == "completed":
        raise ApiProblem(409, "batch-ended", f"batch {batch.id} has completed already")
    if await fw.openai_records.cancel_openai_batch(batch.id, tenant, fw.clock.now()):
        # Waiting ones first: none of them is sent once its cancel landed. A running one's
        # call is read to its end, and its slot taken until then (core/hangup.py).
        tasks = await BatchEnder(fw.runtime).tasks(batch)
        for task in sorted(tasks, key=lambda t: t.status is Status.RUNNING):
            if not task.terminal:
                with contextlib.suppress(IllegalTransition):  # it ended meanwhile
                    await fw.cancel(task.id, tenant=tenant)
    return await _current(state, await _found(state, batch_id, tenant))


async def _current(state: ApiState, batch: OpenAIBatch) -> dict[str, Any]:
    """The batch object; ends the batch first if its last task has ended."""
    counts = await state.fw.batch_counts(batch.id, tenant=batch.tenant)
    ended = sum(n for s, n in counts.items() if Status(s) in TERMINAL)
    if batch.status in ("in_progress", "cancelling") and ended == batch.total:
        await BatchEnder(state.fw.runtime).end(batch)
        batch = await _found(state, batch.id, batch.tenant)
    done = sum(counts.get(s.value, 0) for s in SUCCESS)
    return _batch_object(batch, done, ended - done)


def _at(value: float | None) -> int | None:
    return None if value is None else int(value)


def _batch_object(batch: OpenAIBatch, completed: int, failed: int) -> dict[str, Any]:
    ended = _at(batch.ended_at)
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": int(batch.created_at),
        "expires_at": int(batch.expires_at),
        "finalizing_at": ended,
        "completed_at": ended if batch.status == "completed" else None,
        "failed_at": None,
        "expired_at": ended if batch.status == "expired" else None,
        "cancelling_at": _at(batch.cancelling_at),
        "cancelled_at": ended if batch.status == "cancelled" else None,
        "request_counts": {"total": batch.total, "completed": completed, "failed": failed},
        "metadata": batch.metadata,
    }
