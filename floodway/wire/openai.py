"""OpenAI's shapes, for the OpenAI-compatible API (docs/openai.md): its error object, a task
that ended without a result as OpenAI would tell it, and the lines of a batch's output and
error files. Written once here for the HTTP answers and for the batch files (which
maintenance may write), and the endpoints' paths."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from floodway.core.states import Status
from floodway.core.task import ErrorClass, Task

#: the endpoints a kind with ``adapter = "openai"`` may serve, and each one's path under an
#: OpenAI base URL (``.../v1``)
ENDPOINT_PATHS: dict[str, str] = {
    "chat": "/chat/completions",
    "embeddings": "/embeddings",
    "images": "/images/generations",
    "responses": "/responses",
}
#: a Responses stream's last event is one of these (a chat stream's is ``[DONE]``)
RESPONSE_ENDS = frozenset({"response.completed", "response.failed", "response.incomplete"})


def is_last_event(data: str) -> bool:
    """Whether a stream's event (its SSE ``data``) is its last: ``[DONE]`` or a Responses end."""
    if data == "[DONE]":
        return True
    if '"type":"response.' not in data.replace(" ", ""):
        return False
    try:
        event = json.loads(data)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("type") in RESPONSE_ENDS


#: the result of a streamed call: ``{"object": STREAM_OBJECT, "events": [data, ...]}``, its
#: events as the provider sent them (the last one ``[DONE]``)
STREAM_OBJECT = "floodway.stream"
#: the same, as a batch line's ``url`` names them: path -> endpoint
BATCH_URLS: dict[str, str] = {"/v1" + path: endpoint for endpoint, path in ENDPOINT_PATHS.items()}

#: a provider's refusal the caller can act on: any 4xx but those about the server's own
#: account (its key, its permissions, its quota), which are not the caller's to fix
_CALLERS_STATUSES = frozenset(range(400, 500)) - {401, 403, 429}
#: how an adapter's error message starts ("POST <url>: HTTP 400 <code>: "): the upstream URL
#: is the server's business, the status is the provider's answer
_UPSTREAM = re.compile(r"^[A-Z]+ \S+: (?:HTTP (\d{3})(?: \S+)?: )?", re.DOTALL)


def openai_error(status: int, code: str | None, message: str, param: Any = None) -> dict[str, Any]:
    """OpenAI's error object: the official SDKs read ``message``, ``type`` and ``code``."""
    if status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    elif status == 401:
        kind = "authentication_error"
    else:
        kind = "invalid_request_error"
    return {"message": message, "type": kind, "param": param, "code": code}


#: statuses a retry of the same request may change: a timeout, a rate limit, an outage
_RETRY_MAY_HELP = frozenset({408, 429, 500, 503})


def error_headers(status: int, headers: dict[str, str], retry_after: Any = None) -> dict[str, str]:
    """The headers the official SDKs read on an error: on a 429 the wait as ``retry-after-ms``
    (which they prefer to ``Retry-After``), and on an answer a retry cannot change (a refusal,
    work that failed after floodway's own retries) ``x-should-retry: false``, so the SDK's own
    retries never submit the same work again."""
    out = dict(headers)
    lower = {k.lower() for k in out}
    if status == 429 and "retry-after-ms" not in lower:
        seconds = retry_after if isinstance(retry_after, int | float) else None
        if seconds is None:
            given = next((v for k, v in out.items() if k.lower() == "retry-after"), None)
            seconds = float(given) if given is not None and given.isdigit() else None
        if seconds is not None:
            out["retry-after-ms"] = str(math.ceil(1000 * seconds))
    if status not in _RETRY_MAY_HELP and "x-should-retry" not in lower:
        out["x-should-retry"] = "false"
    return out


@dataclass(frozen=True)
class TaskFailure:
    """A task that ended without a result: the HTTP status, floodway's problem slug and the
    code (the provider's own, when it refused the request) that the client is told."""

    status: int
    slug: str
    code: str | None
    message: str


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A page of a list as OpenAI answers one (files, batches): cursors are the page's ends."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def task_failure(task: Task) -> TaskFailure:
    error = task.error
    message = error.message if error is not None else task.status.value
    found = _UPSTREAM.match(message)
    upstream = int(found.group(1)) if found and found.group(1) else None
    message = message[found.end() :] if found else message
    if task.status is Status.TIMEOUT:
        detail = f"the task's deadline passed: {message}"
        return TaskFailure(504, "deadline-passed", "deadline-passed", detail)
    if task.status is Status.CANCELLED:
        return TaskFailure(409, "task-cancelled", "task-cancelled", "the task was cancelled")
    code = error.type if error is not None else None
    if error is not None and error.cls is ErrorClass.FATAL and upstream in _CALLERS_STATUSES:
        return TaskFailure(upstream, "upstream-refused", code, message)
    detail = f"the provider did not answer usefully: {message}"
    return TaskFailure(502, "upstream-failed", code, detail)


def custom_id(task: Task) -> str | None:
    value = task.metadata.get("custom_id")
    return value if isinstance(value, str) else None


def output_line(task: Task) -> dict[str, Any]:
    """A success in a batch's output file: the provider's body, under the line's custom_id."""
    response = {"status_code": 200, "request_id": task.id, "body": task.result}
    return {"id": f"batch_req_{task.id}", "custom_id": custom_id(task), "response": response,
            "error": None}  # fmt: skip


def error_line(task: Task) -> dict[str, Any]:
    """A failure in a batch's error file: the answer a single request would have had, or,
    for a request that never ran to an answer, OpenAI's batch error code."""
    line: dict[str, Any] = {"id": f"batch_req_{task.id}", "custom_id": custom_id(task)}
    if task.status is Status.CANCELLED:
        error = {"code": "batch_cancelled", "message": "the batch was cancelled"}
        return {**line, "response": None, "error": error}
    if task.status is Status.TIMEOUT:
        error = {"code": "batch_expired", "message": "the batch's completion window ended first"}
        return {**line, "response": None, "error": error}
    failed = task_failure(task)
    body = {"error": openai_error(failed.status, failed.code or failed.slug, failed.message)}
    response = {"status_code": failed.status, "request_id": task.id, "body": body}
    return {**line, "response": response, "error": None}
