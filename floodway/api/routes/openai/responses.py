"""The Responses API under ``/openai/v1/responses``, served by a kind with ``endpoint =
"responses"`` (its provider must speak Responses: a model served only on chat is refused,
naming the kind that serves it).

Every response floodway answers is named by its task: ``resp_<task id>``. A plain request
waits for its task and answers the provider's response under that id; ``stream`` answers its
events as they come (:mod:`.streams`); ``background: true`` answers the queued response at
once, and its task runs as a stream whose events are kept, so ``GET .../{id}?stream=true
&starting_after=N`` resumes it by event number. ``previous_response_id`` naming a floodway
response is sent to the provider as the provider's own id.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from floodway.api.auth import Tenant
from floodway.api.problems import ApiProblem
from floodway.api.routes.openai.calls import (
    await_call,
    is_retry,
    submit_call,
    wait_budget,
)
from floodway.api.routes.openai.catalog import served
from floodway.api.routes.openai.headers import task_headers
from floodway.api.routes.openai.streams import Render, StreamReader, stream_answer
from floodway.api.state import ApiState, api_state
from floodway.core.errors import IllegalTransition, TaskNotFound, WaitTimeout
from floodway.core.states import Status
from floodway.core.task import Lane, Task
from floodway.wire.openai import RESPONSE_ENDS, STREAM_OBJECT, task_failure
from floodway.wire.tasks import printable

router = APIRouter()
State = Annotated[ApiState, Depends(api_state)]
PREFIX = "resp_"
_ID = re.compile(r"^resp_(t_[0-9A-Z]{26})$")
#: headers of the answer's body, which the new body replaces
_BODY_HEADERS = frozenset({"content-length", "content-type"})
#: how long a cancel waits for a running call to stop before it answers
CANCEL_WAIT_S = 5.0
_STATUS = {
    Status.QUEUED: "queued",
    Status.RETRYING: "queued",
    Status.RUNNING: "in_progress",
    Status.CANCELLED: "cancelled",
}


def response_id(task: Task) -> str:
    return PREFIX + task.id


async def create(
    state: ApiState,
    request: Request,
    tenant: str,
    kind: str,
    body: dict[str, Any],
    key: str | None,
) -> Response:
    """``POST /responses`` for the kind that serves its model (checked by the caller)."""
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and previous.startswith(PREFIX):
        earlier = await _task(state, previous, tenant, param="previous_response_id")
        body = {**body, "previous_response_id": _provider_id(earlier) or previous}
    background = body.get("background") is True
    lane = Lane.BACKGROUND if background else Lane.INTERACTIVE
    task = await submit_call(
        state, tenant, kind, body, key, retry=is_retry(request.headers), lane=lane
    )
    if background:
        return _json(response_object(task), task)
    if body.get("stream") is True:
        return await stream_answer(StreamReader(state, task, render_events(task), named=True))
    left = None if task.deadline_at is None else task.deadline_at - state.fw.clock.now()
    answered = await await_call(state, task, wait_budget(request.headers, left))
    done = json.loads(bytes(answered.body))
    kept = {k: v for k, v in answered.headers.items() if k.lower() not in _BODY_HEADERS}
    return JSONResponse({**done, "id": response_id(task)}, headers=kept)


def refuse_chat_only(state: ApiState, body: dict[str, Any]) -> None:
    """A model some chat kind serves, but no responses kind: say so, and what to declare."""
    model = body.get("model")
    chat_kind = served(state.settings).get(("chat", model)) if isinstance(model, str) else None
    if chat_kind is not None:
        raise ApiProblem(
            400,
            "responses-unsupported",
            f"model {model!r} is served by kind {chat_kind!r}, which calls chat completions: "
            'declare a kind with endpoint = "responses" (its provider must speak the Responses '
            "API) to serve /responses",
            param="model",
        )


@router.get("/responses/{rid}")
async def get_response(
    rid: str,
    tenant: Tenant,
    state: State,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1)] = None,
) -> Response:
    task = await _task(state, rid, tenant)
    if stream:
        render = render_events(task, after=-1 if starting_after is None else starting_after)
        return await stream_answer(StreamReader(state, task, render, named=True))
    return _json(response_object(task), task)


@router.delete("/responses/{rid}")
async def delete_response(rid: str, tenant: Tenant, state: State) -> dict[str, Any]:
    """Forgets the response's result and events (a running one is cancelled first)."""
    task = await _task(state, rid, tenant)
    if not task.terminal:
        task = await _cancel(state, task)
    await state.fw.forget_result(task.id, tenant=tenant)
    return {"id": response_id(task), "object": "response", "deleted": True}


@router.post("/responses/{rid}/cancel")
async def cancel_response(rid: str, tenant: Tenant, state: State) -> Response:
    task = await _task(state, rid, tenant)
    if not (isinstance(task.input, dict) and task.input.get("background") is True):
        raise ApiProblem(
            400, "not-background", "only a background response can be cancelled", param="rid"
        )
    if not task.terminal:
        task = await _cancel(state, task)
    return _json(response_object(task), task)


@router.get("/responses/{rid}/input_items")
async def input_items(rid: str, tenant: Tenant, state: State) -> dict[str, Any]:
    task = await _task(state, rid, tenant)
    given = task.input.get("input") if isinstance(task.input, dict) else None
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given or []
    data = []
    for n, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
        data.append({"id": f"msg_{task.id}_{n}", "type": "message", "status": "completed",
                     "role": item.get("role", "user"), "content": parts})  # fmt: skip
    data.reverse()  # newest first, as OpenAI lists them
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": False}


async def _task(state: ApiState, rid: str, tenant: str, param: str = "rid") -> Task:
    found = _ID.fullmatch(rid)
    task = None
    if found:
        with contextlib.suppress(TaskNotFound):
            task = await state.fw.get(found.group(1), tenant=tenant)
    kinds = {k for (e, _), k in served(state.settings).items() if e == "responses"}
    gone = task is not None and task.terminal and task.result is None and not task.error
    if task is None or task.kind not in kinds or (gone and task.status is Status.SUCCEEDED):
        raise ApiProblem(404, "response-not-found", f"no response {rid[:80]!r}", param=param)
    return task


async def _cancel(state: ApiState, task: Task) -> Task:
    """Cancel, and give a running call a moment to stop (its worker gets the signal)."""
    fw = state.fw
    with contextlib.suppress(IllegalTransition):  # it ended meanwhile
        task = await fw.cancel(task.id, tenant=task.tenant)
    if task.terminal:
        return task
    with contextlib.suppress(WaitTimeout):
        return await fw.wait(task.id, timeout=CANCEL_WAIT_S, tenant=task.tenant)
    return await fw.get(task.id, tenant=task.tenant)


def _json(body: dict[str, Any], task: Task) -> JSONResponse:
    return JSONResponse(printable(body), headers=task_headers(task.id, task.upstream_request_id))


def _final(task: Task) -> dict[str, Any] | None:
    """The provider's finished response: the answer itself, or a stream's last event's."""
    result = task.result
    if not isinstance(result, dict):
        return None
    if result.get("object") != STREAM_OBJECT:
        return result
    for data in reversed(result.get("events") or []):
        try:
            event = json.loads(data)
        except (TypeError, ValueError):
            continue
        if isinstance(event, dict) and event.get("type") in RESPONSE_ENDS:
            response = event.get("response")
            return response if isinstance(response, dict) else None
    return None


def _provider_id(task: Task) -> str | None:
    final = _final(task)
    rid = final.get("id") if final else None
    return rid if isinstance(rid, str) else None


def response_object(task: Task) -> dict[str, Any]:
    """The response as OpenAI's object, under floodway's id, whatever state its task is in."""
    asked = task.input if isinstance(task.input, dict) else {}
    final = _final(task) if task.status in (Status.SUCCEEDED, Status.DEDUPED) else None
    if final is not None:
        return {**final, "id": response_id(task), "background": asked.get("background") is True}
    status = _STATUS.get(task.status, "failed")
    error = None
    if status == "failed":
        failed = task_failure(task)
        error = {"code": failed.code or failed.slug, "message": failed.message}
    return {
        "id": response_id(task),
        "object": "response",
        "created_at": int(task.created_at),
        "status": status,
        "background": asked.get("background") is True,
        "error": error,
        "incomplete_details": None,
        "instructions": asked.get("instructions"),
        "max_output_tokens": asked.get("max_output_tokens"),
        "metadata": asked.get("metadata") or {},
        "model": asked.get("model"),
        "output": [],
        "parallel_tool_calls": True,
        "previous_response_id": asked.get("previous_response_id"),
        "store": asked.get("store", True) is not False,
        "temperature": asked.get("temperature"),
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": asked.get("top_p"),
        "truncation": "disabled",
        "usage": None,
    }


def render_events(task: Task, after: int = -1) -> Render:
    """A Responses stream's events under floodway's response id, named by their type, from
    the one numbered after ``after`` (``starting_after``)."""
    rid = response_id(task)

    def render(data: str) -> str | None:
        try:
            event = json.loads(data)
        except ValueError:
            return None
        if not isinstance(event, dict):
            return None
        number = event.get("sequence_number")
        if isinstance(number, int) and number <= after:
            return None
        response = event.get("response")
        if isinstance(response, dict):
            event["response"] = {**response, "id": rid}
        kind = event.get("type", "message")
        return f"event: {kind}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"

    return render
