"""Every error is an RFC 9457 problem, and bad input never gets a 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from floodway import Floodway
from floodway.api import create_app, serving
from tests.integration.conftest import ApiServer, StartApi

PROBLEM = "application/problem+json"


def assert_problem(resp: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body: dict[str, Any] = resp.json()
    assert body["type"] == f"urn:floodway:problem:{slug}"
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    return body


async def test_unknown_route_and_wrong_method(api: ApiServer) -> None:
    http = await api.client()
    assert_problem(await http.get("/v2/nothing"), 404, "not-found")
    resp = await http.put("/v1/tasks")
    assert_problem(resp, 405, "method-not-allowed")
    assert "POST" in resp.headers["allow"]


async def test_validation_errors_are_422_problems(api: ApiServer) -> None:
    http = await api.client()
    cases: list[Any] = [
        {"input": {}},  # no kind
        {"kind": "sim", "input": [1, 2]},  # input not an object
        {"kind": "sim", "input": {}, "lane": "fast"},
        {"kind": "sim", "input": {}, "max_attempts": 0},
        {"kind": "sim", "input": {}, "deadline_s": -1},
        {"kind": "sim", "input": {}, "callback_url": "ftp://example.invalid/x"},
        {"kind": "sim", "input": {}, "surprise": True},  # unknown field
        ["not", "an", "object"],
    ]
    for body in cases:
        problem = assert_problem(await http.post("/v1/tasks", json=body), 422, "validation-error")
        assert problem["errors"] and {"loc", "msg", "type"} <= set(problem["errors"][0])


async def test_floodway_errors_map_to_problems(start_api: StartApi) -> None:
    def costly(fw: Floodway, app: FastAPI) -> None:
        async def handler(ctx: object, value: dict[str, Any]) -> dict[str, Any]:
            return value

        fw.kind("priced", cost=lambda inp: len(inp["text"]))(handler)

    server = await start_api(configure=costly)
    http = await server.client()
    unknown = assert_problem(
        await http.post("/v1/tasks", json={"kind": "nope", "input": {}}), 422, "unknown-kind"
    )
    assert unknown["kind"] == "nope" and unknown["known_kinds"] == ["priced", "sim"]
    near = (await http.post("/v1/tasks", json={"kind": "simm", "input": {}})).json()
    assert "did you mean 'sim'?" in near["detail"]
    # The kind's cost function chokes on this input: the caller's error, not a 500.
    assert_problem(
        await http.post("/v1/tasks", json={"kind": "priced", "input": {"no_text": 1}}),
        422,
        "invalid-input",
    )
    # Python's json accepts NaN; a task holding one could never be answered as JSON. A lone
    # surrogate escape is valid JSON syntax but no text. Both are refused, never a 500.
    for raw in (
        b'{"kind": "sim", "input": {"x": NaN}}',
        b'{"kind": "sim", "input": {}, "metadata": {"x": Infinity}}',
        b'{"kind": "sim", "input": {"a": "\\ud800"}}',
        b'{"kind": "\\udfff", "input": {}}',
    ):
        resp = await http.post(
            "/v1/tasks", content=raw, headers={"content-type": "application/json"}
        )
        assert resp.status_code == 422 and resp.headers["content-type"] == PROBLEM
    assert (
        await http.post("/v1/tasks", json={"kind": "priced", "input": {"text": "ab"}})
    ).status_code == 202


async def test_malformed_and_too_deep_json(api: ApiServer) -> None:
    http = await api.client()
    json_headers = {"content-type": "application/json"}
    assert_problem(
        await http.post("/v1/tasks", content=b'{"kind": "sim", "input": {', headers=json_headers),
        400,
        "malformed-json",
    )
    deep = b'{"kind": "sim", "input": ' + b'{"a": ' * 40 + b"1" + b"}" * 41
    problem = assert_problem(
        await http.post("/v1/tasks", content=deep, headers=json_headers), 400, "json-too-deep"
    )
    assert problem["limit"] == "max_json_depth"
    # Brackets inside strings are text, not nesting.
    shallow = b'{"kind": "sim", "input": {"s": "' + b"[" * 100 + b'"}}'
    assert (await http.post("/v1/tasks", content=shallow, headers=json_headers)).status_code == 202
    # A pathological nesting that would crash a recursive parser is refused just the same.
    abyss = b"[" * 100_000 + b"]" * 100_000
    assert_problem(
        await http.post("/v1/tasks", content=abyss, headers=json_headers), 400, "json-too-deep"
    )


async def test_oversized_bodies_are_413_with_or_without_content_length(
    start_api: StartApi,
) -> None:
    server = await start_api(api={"max_body_bytes": 2048})
    http = await server.client()
    big = {"kind": "sim", "input": {"blob": "x" * 4096}}
    problem = assert_problem(await http.post("/v1/tasks", json=big), 413, "body-too-large")
    assert problem["limit"] == "max_body_bytes" and problem["max_bytes"] == 2048

    async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to trust
        yield b'{"kind": "sim", "input": {"blob": "'
        for _ in range(8):
            yield b"y" * 512
        yield b'"}}'

    async with httpx.AsyncClient(base_url=server.url) as raw:
        resp = await raw.post(
            "/v1/tasks", content=chunks(), headers={"content-type": "application/json"}
        )
    assert_problem(resp, 413, "body-too-large")
    assert (
        await http.post("/v1/tasks", json={"kind": "sim", "input": {"ok": 1}})
    ).status_code == 202


async def test_an_unexpected_exception_is_a_500_problem(start_api: StartApi) -> None:
    def add_broken_route(fw: Floodway, app: FastAPI) -> None:
        @app.get("/boom")
        async def boom() -> None:
            raise RuntimeError("a bug")

    server = await start_api(configure=add_broken_route)
    http = await server.client()
    problem = assert_problem(await http.get("/boom"), 500, "internal-error")
    assert "a bug" not in problem["detail"]  # internals stay in the log
    assert (await http.get("/healthz")).status_code == 200  # and the server keeps serving


async def raw_request(url: str, head: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` as it is (no client would send a control character in a header)."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    header_block, _, body = rest.partition(b"\r\n\r\n")
    headers = dict(
        line.decode().lower().split(": ", 1) for line in header_block.split(b"\r\n") if line
    )
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("path", ["/v1/tasks", "/openai/v1/chat/completions"])
async def test_a_control_character_in_a_header_is_a_problem_not_plain_text(
    api: ApiServer, path: str
) -> None:
    body = b'{"kind": "sim", "input": {}}'
    head = (
        (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
        ).encode()
        + b"Idempotency-Key: a\x01b\r\n\r\n"
        + body
    )
    status, headers, answer = await raw_request(api.url, head)
    assert status == 400 and headers["content-type"] == PROBLEM
    problem = json.loads(answer)
    assert problem["type"] == "urn:floodway:problem:malformed-request"
    assert "control character" in problem["detail"]
    if path.startswith("/openai/"):  # what the official SDKs read
        assert problem["error"]["type"] == "invalid_request_error"
    assert await api.fw.list_tasks() == []


async def test_a_server_with_no_kinds_says_so_in_its_422(tmp_path: Path) -> None:
    fw = Floodway(database=f"sqlite:///{tmp_path}/empty.db")
    async with (
        serving(create_app(fw, run_workers=False)) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        answer = await http.post("/v1/tasks", json={"kind": "image", "input": {}})
    problem = assert_problem(answer, 422, "unknown-kind")
    assert "no kinds are configured" in problem["detail"] and "--config" in problem["detail"]
