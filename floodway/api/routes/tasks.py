"""``/v1/tasks``: submit, read, list, cancel, retry."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import StringConstraints, TypeAdapter

from floodway.api.auth import Tenant, caller_of
from floodway.api.direct import body_value, json_payload, validate
from floodway.api.media import json_response, require_json
from floodway.api.openapi import problems, submit_route
from floodway.api.problems import ApiProblem
from floodway.api.schemas import SubmitIn, SubmitOut, TaskPage
from floodway.api.state import ApiState, api_state
from floodway.core.errors import TaskNotFound
from floodway.core.states import Status
from floodway.core.task import Lane
from floodway.store.base import TaskQuery
from floodway.wire.cursors import CursorRefused, Cursors
from floodway.wire.tasks import TaskOut, task_json, task_out

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])

State = Annotated[ApiState, Depends(api_state)]
KEY_HEADER = "Idempotency-Key"
_KEY_LENGTH = {"min_length": 1, "max_length": 255}
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=KEY_HEADER,
        description="The same key again (same tenant, within its TTL) returns the same task",
        **_KEY_LENGTH,
    ),
]
_KEY = TypeAdapter(Annotated[str, StringConstraints(**_KEY_LENGTH)])
_SUBMIT = TypeAdapter(SubmitIn)

_TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: the name of this list in its cursors (a cursor of another list is refused)
LISTING = "tasks"


def checked_id(task_id: str) -> str:
    """An id that cannot exist is simply not found (never a 422 or a database error)."""
    if not _TASK_ID.fullmatch(task_id):
        raise TaskNotFound(task_id[:64])
    return task_id


def read_cursor(cursors: Cursors, tenant: str, cursor: str, listing: str = LISTING) -> int:
    """The position of a page cursor (``?after=``) given to ``tenant`` for ``listing``."""
    try:
        return cursors.decode(tenant, listing, cursor)
    except CursorRefused:
        raise ApiProblem(
            400,
            "invalid-cursor",
            "after: not a cursor this API gave this caller for this list (pass the 'next' of "
            "a page you listed, with the same key: cursors are per tenant)",
            param="after",
        ) from None


@router.post("", **submit_route(SubmitOut, "Submit a task", "the same task"))
async def submit(
    body: SubmitIn, tenant: Tenant, state: State, key: IdempotencyKey = None
) -> Response:
    """Queue a task and answer at once (202); never waits on the provider."""
    (submitted,) = await state.fw.runtime.submit(
        [body.request(key)], tenant=tenant, gate=state.gate
    )
    return json_response(
        task_json(submitted.task, reused=submitted.reused), 200 if submitted.reused else 202
    )


async def submit_direct(request: Request) -> Response:
    """``submit`` as FastAPI would call it, its parameters read here in FastAPI's order: the
    body parsed (400), the JSON check (415), the caller (401), then the header and the body
    validated (422)."""
    payload = await json_payload(request)
    await require_json(request)
    who = await caller_of(request)
    errors: list[dict[str, Any]] = []
    sent_key = request.headers.get(KEY_HEADER)
    key = None if sent_key is None else validate(_KEY, sent_key, ("header", KEY_HEADER), errors)
    body = body_value(_SUBMIT, payload, errors)
    if errors or body is None:
        raise RequestValidationError(errors)
    return await submit(body, who.tenant, await api_state(request), key)


#: answered by floodway.api.direct.DirectRoutes, ahead of FastAPI's router
DIRECT = {("POST", "/v1/tasks"): submit_direct}


@router.get("", response_model=TaskPage, summary="List tasks", responses=problems(400, 401, 422))
async def list_tasks(
    tenant: Tenant,
    state: State,
    status: Status | None = None,
    kind: Annotated[str | None, Query(max_length=200)] = None,
    lane: Lane | None = None,
    batch: Annotated[
        str | None, Query(max_length=64, description="only the tasks of this batch")
    ] = None,
    order: Annotated[
        Literal["asc", "desc"],
        Query(description="`asc`: oldest first; `desc`: newest first"),
    ] = "asc",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        str | None,
        Query(
            max_length=200,
            description="a page's `next` cursor (pass the same `order` with it)",
        ),
    ] = None,
) -> TaskPage:
    """The caller's tasks, oldest or newest first, one page at a time (keyset pagination:
    a page never repeats or skips a task that others insert meanwhile)."""
    cursors = await state.cursors()
    after_seq = read_cursor(cursors, tenant, after) if after else None
    query = TaskQuery(
        tenant=tenant,
        status=status,
        kind=kind,
        lane=lane,
        batch_id=batch,
        after_seq=after_seq,
        limit=limit + 1,
        descending=order == "desc",
    )
    found = await state.fw.list_tasks(query)
    page = found[:limit]
    more = len(found) > limit
    return TaskPage(
        items=[task_out(t) for t in page],
        next=cursors.encode(tenant, LISTING, page[-1].seq) if more and page else None,
    )


@router.get(
    "/{task_id}", response_model=TaskOut, summary="Get a task", responses=problems(401, 404)
)
async def get_task(task_id: str, tenant: Tenant, state: State) -> TaskOut:
    return task_out(await state.fw.get(checked_id(task_id), tenant=tenant))


@router.delete(
    "/{task_id}", response_model=TaskOut, summary="Cancel a task", responses=problems(401, 404, 409)
)
async def cancel_task(task_id: str, tenant: Tenant, state: State) -> TaskOut:
    """Queued or retrying: cancelled at once. Running: cancelled at once too, while its call,
    sent already, is read to its end, recorded and billed (the provider bills it all the
    same), and its provider slot stays taken until then. Already terminal: 409."""
    return task_out(await state.fw.cancel(checked_id(task_id), tenant=tenant))


@router.post(
    "/{task_id}/retry",
    response_model=TaskOut,
    summary="Retry a failed, dead or timed-out task",
    responses=problems(401, 402, 404, 409),
)
async def retry_task(task_id: str, tenant: Tenant, state: State) -> TaskOut:
    return task_out(await state.fw.retry(checked_id(task_id), tenant=tenant))
