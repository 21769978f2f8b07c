"""The openai adapter against a small OpenAI-shaped server on loopback.

The server's answer is chosen by the first message's content (chat), so each test names the
provider behaviour it checks: quota, billing, 429 with retry-after-ms or an HTTP date, context
length, content policy, content-filter stops and refusals.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response

from floodway import ConfigError, FatalError, RetryableError
from floodway.kinds import KindSpec
from floodway.providers.cost import DEFAULT_MAX_OUTPUT_TOKENS
from floodway.providers.sim import serve_app
from tests.integration.test_providers_http import build, close, make_ctx

LIMIT_HEADERS = {
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "499",
    "x-ratelimit-remaining-tokens": "39000",
    "x-ratelimit-reset-tokens": "1.5s",
}


def error(status: int, code: str | None, type_: str, message: str, **headers: str) -> Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return Response(json.dumps(body), status_code=status, headers=headers)


def openai_like(seen: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        seen.append({"headers": dict(request.headers), "body": body})
        case = body["messages"][0]["content"]
        if case == "quota":
            return error(
                429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota"
            )
        if case == "billing":
            return error(
                400, "billing_hard_limit_reached", "invalid_request_error", "Billing limit hit"
            )
        if case == "busy-ms":
            return error(429, None, "requests", "Rate limit reached", **{"retry-after-ms": "1500"})
        if case == "busy-date":
            when = email.utils.formatdate(time.time() + 20, usegmt=True)
            return error(429, None, "tokens", "Rate limit reached", **{"Retry-After": when})
        if case == "long":
            return error(
                400,
                "context_length_exceeded",
                "invalid_request_error",
                "This model's maximum context length is 8192 tokens",
            )
        if case == "policy":
            return error(
                400,
                "content_policy_violation",
                "invalid_request_error",
                "Your request was rejected by the safety system",
            )
        if case == "broken":
            return error(500, None, "server_error", "The server had an error")
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "hello", "refusal": None},
            "finish_reason": "stop",
        }
        if case == "filtered":
            choice["finish_reason"] = "content_filter"
        if case == "refuse":
            choice["message"]["refusal"] = "I can't help with that."
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [choice],
            "usage": {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20},
        }
        return Response(json.dumps(answer), headers=LIMIT_HEADERS)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await request.json()
        seen.append({"headers": dict(request.headers), "body": body})
        answer = {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
            "usage": {"prompt_tokens": 5, "total_tokens": 5},
        }
        return Response(json.dumps(answer), headers=LIMIT_HEADERS)

    @app.post("/v1/images/generations")
    async def images(request: Request) -> Response:
        body = await request.json()
        seen.append({"headers": dict(request.headers), "body": body})
        count = int(body.get("n", 1))
        answer = {"created": 1, "data": [{"url": f"https://img/{i}"} for i in range(count)]}
        return Response(json.dumps(answer))

    return app


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, list[Any]]]:
    monkeypatch.setenv("FW_TEST_OPENAI_KEY", "sk-test-123")
    seen: list[dict[str, Any]] = []
    async with serve_app(openai_like(seen)) as url:
        yield f"{url}/v1", seen


def chat_kind(base_url: str, **extra: Any) -> KindSpec:
    return build(
        adapter="openai",
        base_url=base_url,
        api_key_env="FW_TEST_OPENAI_KEY",
        model="gpt-test",
        **extra,
    )


async def chat(base_url: str, content: str) -> tuple[Any, Any]:
    spec = chat_kind(base_url)
    ctx = make_ctx()
    try:
        return await spec.handler(ctx, {"messages": [{"role": "user", "content": content}]}), ctx
    finally:
        await close(spec)


async def test_chat_success_settles_usage_and_keeps_rate_limit_headers(
    server: tuple[str, list[Any]],
) -> None:
    url, seen = server
    answer, ctx = await chat(url, "hi")
    assert answer["choices"][0]["message"]["content"] == "hello"
    assert ctx.usage == 20
    assert ctx.response_headers["x-ratelimit-remaining-tokens"] == "39000"
    sent = seen[-1]
    assert sent["headers"]["authorization"] == "Bearer sk-test-123"
    assert sent["body"]["model"] == "gpt-test"


def test_chat_cost_is_prompt_over_four_plus_max_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_TEST_OPENAI_KEY", "sk-test-123")
    spec = chat_kind("http://127.0.0.1:9/v1")
    request = {"messages": [{"role": "user", "content": "x" * 396}], "max_tokens": 100}
    assert spec.estimate(request) == (396 + len("user")) // 4 + 100
    assert not spec.idempotent and spec.poll is None and spec.lookup is None


def test_a_chat_estimate_is_its_worst_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """n answers of the request's output bound; with none, the kind's max_output_tokens, else
    the model's published limit; no field of the request lowers it."""
    monkeypatch.setenv("FW_TEST_OPENAI_KEY", "sk-test-123")
    ask = {"messages": [{"role": "user", "content": "abcd"}]}
    spec = chat_kind("http://127.0.0.1:9/v1")
    assert spec.estimate({**ask, "max_completion_tokens": 50, "n": 100}) == 2 + 100 * 50
    assert spec.estimate(ask) == 2 + DEFAULT_MAX_OUTPUT_TOKENS  # gpt-test: not in the table
    assert spec.estimate({**ask, "model": "gpt-4o-mini", "n": 2}) == 2 + 2 * 16_384
    assert spec.estimate({**ask, "model": "gpt-4.1-nano"}) == 2 + 32_768
    assert spec.estimate({**ask, "tokens": 1}) == 2 + DEFAULT_MAX_OUTPUT_TOKENS
    bounded = chat_kind("http://127.0.0.1:9/v1", max_output_tokens=1000)
    assert bounded.estimate({**ask, "n": 3}) == 2 + 3 * 1000
    assert bounded.estimate({**ask, "max_tokens": 10}) == 2 + 10
    responses = chat_kind("http://127.0.0.1:9/v1", endpoint="responses", max_output_tokens=500)
    assert (
        responses.estimate({"input": "abcd", "tokens": 1})
        == len('{"input":"abcd","tokens":1}') // 4 + 500
    )
    images = chat_kind("http://127.0.0.1:9/v1", endpoint="images")
    assert images.estimate({"prompt": "a cat", "n": 4}) == 4


async def test_plain_429_is_throttled_and_honours_retry_after_ms(
    server: tuple[str, list[Any]],
) -> None:
    with pytest.raises(RetryableError) as info:
        await chat(server[0], "busy-ms")
    assert info.value.throttled and info.value.retry_after == 1.5


async def test_429_with_an_http_date(server: tuple[str, list[Any]]) -> None:
    with pytest.raises(RetryableError) as info:
        await chat(server[0], "busy-date")
    assert info.value.throttled
    assert info.value.retry_after is not None and 15 <= info.value.retry_after <= 20


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("quota", "insufficient_quota"),
        ("billing", "billing_hard_limit_reached"),
        ("long", "context_length_exceeded"),
        ("policy", "content_policy_violation"),
        ("filtered", "content_filter"),
        ("refuse", "refusal"),
    ],
)
async def test_fatal_answers_say_why(server: tuple[str, list[Any]], case: str, reason: str) -> None:
    with pytest.raises(FatalError) as info:
        await chat(server[0], case)
    assert info.value.error_type == reason


async def test_server_errors_are_retryable(server: tuple[str, list[Any]]) -> None:
    with pytest.raises(RetryableError) as info:
        await chat(server[0], "broken")
    assert not info.value.throttled and "The server had an error" in str(info.value)


async def test_embeddings_and_images(server: tuple[str, list[Any]]) -> None:
    url, seen = server
    embed = chat_kind(url, endpoint="embeddings")
    ctx = make_ctx()
    answer = await embed.handler(ctx, {"input": "some text here"})
    assert answer["data"][0]["embedding"] == [0.1, 0.2] and ctx.usage == 5
    assert embed.estimate({"input": ["abcdefgh", "abcd"]}) == 3
    images = chat_kind(url, endpoint="images", cost="fixed:2")
    ctx = make_ctx()
    answer = await images.handler(ctx, {"prompt": "a cat", "n": 3})
    assert len(answer["data"]) == 3 and ctx.usage == 3
    assert images.estimate({"prompt": "a cat", "n": 3}) == 2
    assert seen[-1]["body"]["model"] == "gpt-test"
    await close(embed, images)


def test_a_missing_key_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FW_TEST_OPENAI_KEY", raising=False)
    with pytest.raises(ConfigError, match="FW_TEST_OPENAI_KEY"):
        chat_kind("http://127.0.0.1:9/v1")
