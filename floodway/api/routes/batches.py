"""``/v1/batches``: many tasks in one transaction, and their progress."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import Response

from floodway.api.auth import Tenant
from floodway.api.media import json_response
from floodway.api.openapi import problems, submit_route
from floodway.api.problems import ApiProblem
from floodway.api.schemas import BatchIn, BatchList, BatchOut, BatchStatus, BatchSummary
from floodway.api.state import ApiState, api_state
from floodway.core.states import TERMINAL, Status
from floodway.core.task import new_id
from floodway.runtime import BatchOf
from floodway.wire.tasks import timestamp

router = APIRouter(prefix="/v1/batches", tags=["batches"])

BATCH_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

State = Annotated[ApiState, Depends(api_state)]


@router.post("", **submit_route(BatchOut, "Submit many tasks at once", "the same batch"))
async def submit_batch(
    body: BatchIn,
    tenant: Tenant,
    state: State,
    key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=200,
            description="Replaying the same batch with this key returns the same tasks",
        ),
    ] = None,
) -> Response:
    """All tasks land in one transaction, or none do. One batch is one request for the
    tenant's submit rate. With an Idempotency-Key the same batch again is the same batch (item
    ``i`` also gets the key ``<key>:<i>``); another list of tasks with it is a 409."""
    fw = state.fw
    batch_id = new_id(fw.clock.now(), prefix="b")
    requests = [t.request(None if key is None else f"{key}:{i}") for i, t in enumerate(body.tasks)]
    submitted = await fw.runtime.submit(
        requests, tenant=tenant, gate=state.gate, batch=BatchOf(batch_id, key)
    )
    reused = all(s.reused for s in submitted)
    if reused:
        batch_id = submitted[0].task.batch_id or batch_id
    out = BatchOut(id=batch_id, task_ids=[s.task.id for s in submitted], reused=reused)
    return json_response(out.model_dump(mode="json"), 200 if reused else 202)


@router.get(
    "/{batch_id}",
    response_model=BatchStatus,
    summary="Counts per status of a batch",
    responses=problems(401, 404),
)
async def batch_status(batch_id: str, tenant: Tenant, state: State) -> BatchStatus:
    found = (
        await state.fw.batch_counts(batch_id, tenant=tenant) if BATCH_ID.fullmatch(batch_id) else {}
    )
    if not found:  # an id that cannot exist is simply not found
        raise ApiProblem(
            404, "batch-not-found", f"no batch {batch_id[:64]!r}", batch_id=batch_id[:64]
        )
    return progress(BatchStatus, batch_id, found)


Progress = TypeVar("Progress", bound=BatchStatus)


def progress(
    model: type[Progress], batch_id: str, found: Mapping[str, int], **extra: Any
) -> Progress:
    """A batch's counts for every status, its total, and whether all of it has ended."""
    counts = {s.value: 0 for s in Status}
    counts.update(found)
    total = sum(counts.values())
    done = sum(counts[s.value] for s in TERMINAL) == total
    return model(id=batch_id, total=total, counts=counts, done=done, **extra)


@router.get(
    "",
    response_model=BatchList,
    summary="The caller's newest batches and their progress",
    responses=problems(401, 422),
)
async def list_batches(
    tenant: Tenant,
    state: State,
    limit: Annotated[int, Query(ge=1, le=200, description="how many, newest first")] = 50,
) -> BatchList:
    """The caller's newest batches (by their newest task), each with its counts per status."""
    found = await state.fw.batches(tenant=tenant, limit=limit)
    return BatchList(
        items=[
            progress(BatchSummary, b.batch_id, b.counts, created_at=timestamp(b.created_at))
            for b in found
        ]
    )
