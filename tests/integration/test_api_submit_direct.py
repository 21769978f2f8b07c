"""``POST /v1/tasks`` is a direct route (floodway.api.direct): it must answer every request
exactly as FastAPI's own handling of the same declaration does. Two servers, one answering on
the direct route, the other on the same endpoint declared on a path FastAPI routes itself, get
the same requests in the same order; their answers must match but for ids and clocks."""

from __future__ import annotations

import re
from typing import Any

import httpx
from fastapi import FastAPI

from floodway import Floodway
from floodway.api.media import JSON_BODY
from floodway.api.routes import tasks
from floodway.api.routes.openai import endpoints
from tests.integration.conftest import StartApi

KEYS = {"k-tenant": "tenant", "k-other": "other"}
REFERENCE = "/v1/tasks-reference"
JSON = {"content-type": "application/json"}
TASK = b'{"kind":"sim","input":{"q":1}}'
_VARYING = {"id", "created_at", "updated_at", "deadline_at", "next_attempt_at", "task_id"}
_ID = re.compile(r"\bt_[0-9A-Z]{26}\b")

#: (headers, body): each sent with the tenant's key unless its headers name another
CASES: list[tuple[dict[str, str], bytes]] = [
    (JSON, TASK),
    (JSON, b""),
    ({}, b""),
    (JSON, b"null"),
    (JSON, b"[]"),
    (JSON, b'"text"'),
    (JSON, b"{"),
    (JSON, b"\xe8"),
    ({"content-type": "text/plain"}, TASK),
    ({}, TASK),
    ({"content-type": "application/merge-patch+json; charset=utf-8"}, TASK),
    (JSON, '{"kind":"sim","input":{"q":2}}'.encode("utf-16")),
    (JSON, b'{"kind":"sim","input":{"big":123456789012345678901234567890}}'),
    (JSON, b'{"kind":"sim","input":{"s":"\\ud800"}}'),
    (JSON, b'{"kind":"sim","input":{"n":NaN}}'),
    (JSON, b'{"kind":"sim","input":{},"zz":1}'),
    (JSON, b'{"input":{}}'),
    (JSON, b'{"kind":"sim","input":{},"max_attempts":true}'),
    (JSON, b'{"kind":"sim","input":{},"max_attempts":3.0}'),
    (JSON, b'{"kind":"sim","input":{},"deadline_s":"60"}'),
    (JSON, b'{"kind":"sim","input":{},"callback_url":"ftp://host"}'),
    (JSON, b'{"kind":"nope","input":{}}'),
    ({**JSON, "Idempotency-Key": ""}, b'{"input":{}}'),
    ({**JSON, "Idempotency-Key": "k" * 256}, TASK),
    ({**JSON, "Idempotency-Key": "abc"}, TASK),
    ({**JSON, "Idempotency-Key": "abc"}, TASK),
    ({**JSON, "Idempotency-Key": "abc"}, b'{"kind":"sim","input":{"q":3}}'),
    ({**JSON, "Idempotency-Key": "abc", "X-API-Key": "k-other"}, TASK),
    ({**JSON, "Authorization": ""}, TASK),
    ({**JSON, "Authorization": "Bearer nope"}, TASK),
    ({**JSON, "Authorization": "Bearer nope"}, b"{"),
    ({"content-type": "text/plain", "Authorization": "Bearer nope"}, b"{"),
    ({**JSON, "Authorization": "Basic k-tenant"}, TASK),
    ({**JSON, "Authorization": "bearer k-tenant"}, b'{"x":1}'),
    ({**JSON, "X-API-Key": "k-other"}, TASK),
    ({**JSON, "X-API-Key": ""}, TASK),
    (JSON, b'{"kind":"sim","input":' + b"[" * 40 + b"]" * 40 + b"}"),
]


def add_reference(_: Floodway, app: FastAPI) -> None:
    """The submit endpoint once more, declared alike, on FastAPI's own request handler."""
    app.router.add_api_route(
        REFERENCE,
        tasks.submit,
        methods=["POST"],
        status_code=202,
        dependencies=[JSON_BODY],
    )


def comparable(response: httpx.Response, path: str) -> tuple[Any, ...]:
    headers = sorted(
        (k, v) for k, v in response.headers.items() if k not in ("content-length", "date")
    )
    try:
        body: Any = _steady(response.json())
    except ValueError:
        body = response.text
    if isinstance(body, dict) and body.get("instance") == path:
        body["instance"] = "<path>"
    return response.status_code, headers, body


def _steady(value: Any) -> Any:
    """Ids and times left out: each server draws its own."""
    if isinstance(value, dict):
        return {k: _steady(v) for k, v in value.items() if k not in _VARYING}
    if isinstance(value, list):
        return [_steady(v) for v in value]
    if isinstance(value, str):
        return _ID.sub("<id>", value)
    return value


async def test_the_direct_submit_route_answers_as_fastapis_own_handler(
    start_api: StartApi,
) -> None:
    direct = await start_api(keys=KEYS, run_workers=False)
    reference = await start_api(keys=KEYS, run_workers=False, configure=add_reference)
    statuses = set()
    for headers, body in CASES:
        sent = {"X-API-Key": "k-tenant", **headers}
        if "Authorization" in headers:
            del sent["X-API-Key"]
        answers = []
        for server, path in ((direct, "/v1/tasks"), (reference, REFERENCE)):
            async with httpx.AsyncClient(base_url=server.url) as http:
                response = await http.post(path, headers=sent, content=body)
            answers.append(comparable(response, path))
        assert answers[0] == answers[1], (headers, body)
        statuses.add(answers[0][0])
    # the cases reach every answer the route has short of an outage
    assert statuses >= {200, 202, 400, 401, 409, 415, 422}


OPENAI = "/openai/v1/chat/completions"
OPENAI_CASES: list[tuple[dict[str, str], bytes]] = [
    (JSON, b'{"model":"gpt-9","messages":[]}'),
    (JSON, b"{"),
    (JSON, b"[]"),
    ({"content-type": "text/plain"}, b"{}"),
    ({**JSON, "Authorization": "Bearer nope"}, b"{}"),
    ({**JSON, "Idempotency-Key": "k" * 256}, b"{}"),
    ({**JSON, "Idempotency-Key": "k"}, b'{"messages":[]}'),
]


def add_openai_reference(_: Floodway, app: FastAPI) -> None:
    app.router.add_api_route(
        OPENAI + "-reference",
        endpoints.chat_completions,
        methods=["POST"],
        dependencies=[JSON_BODY],
    )


async def test_the_direct_openai_routes_answer_as_fastapis_own_handler(
    start_api: StartApi,
) -> None:
    direct = await start_api(keys=KEYS, run_workers=False)
    reference = await start_api(keys=KEYS, run_workers=False, configure=add_openai_reference)
    for headers, body in OPENAI_CASES:
        sent = {"X-API-Key": "k-tenant", **headers}
        if "Authorization" in headers:
            del sent["X-API-Key"]
        answers = []
        for server, path in ((direct, OPENAI), (reference, OPENAI + "-reference")):
            async with httpx.AsyncClient(base_url=server.url) as http:
                response = await http.post(path, headers=sent, content=body)
            del response.headers["x-request-id"]  # drawn by each server
            answers.append(comparable(response, path))
        assert answers[0] == answers[1], (headers, body)
