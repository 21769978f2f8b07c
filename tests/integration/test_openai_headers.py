"""The headers the official SDK reads: request ids, rate limits, and whether to retry."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import openai
import pytest

from floodway.config import KindConfig, ResourceConfig
from floodway.store.base import TaskQuery
from tests.acceptance.clirun import free_port
from tests.integration.conftest import StartApi
from tests.integration.openai_setup import KEYS, start_front


def _ask(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


async def test_every_answer_names_its_request_and_an_error_says_a_retry_cannot_help(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack)
    client = front.sdk()
    raw = await client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=_ask("hi")
    )
    assert raw.headers["x-request-id"] == raw.headers["x-floodway-task"]
    assert raw.request_id == raw.headers["x-floodway-task"]  # what the SDK shows as _request_id
    listed = await client.models.with_raw_response.list()
    assert listed.headers["x-request-id"].startswith("req_")
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.chat.completions.create(model="gpt-9", messages=_ask("hi"))
    assert unknown.value.response.headers["x-should-retry"] == "false"
    assert unknown.value.request_id is not None
    async with httpx.AsyncClient(base_url=f"{front.server.url}/openai/v1") as http:
        # The guard answers this one before any route: it is an OpenAI answer all the same.
        wrong = await http.post(
            "/chat/completions",
            content=b"hi",
            headers={"Authorization": "Bearer key-a", "Content-Type": "text/plain"},
        )
    assert wrong.status_code == 415 and wrong.headers["x-should-retry"] == "false"
    assert wrong.headers["x-request-id"].startswith("req_")


async def test_a_calls_answer_carries_floodways_view_of_the_resources_limits(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    limits = ResourceConfig(requests_per_minute=600, tokens_per_minute=90_000)
    front = await start_front(
        start_api,
        api_stack,
        kind_options={"resource": "openai"},
        resources={"openai": limits},
    )
    raw = await front.sdk().chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=_ask("hi"), max_tokens=100
    )
    headers = raw.headers
    assert headers["x-ratelimit-limit-requests"] == "600"
    assert headers["x-ratelimit-limit-tokens"] == "90000"
    assert 0 <= int(headers["x-ratelimit-remaining-requests"]) < 600  # this call took one
    assert 0 <= int(headers["x-ratelimit-remaining-tokens"]) < 90_000
    assert headers["x-ratelimit-reset-requests"].endswith(("ms", "s"))


async def test_one_sdk_call_to_an_unreachable_provider_is_one_task_and_one_http_attempt(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """The SDK retries a 502 twice by default; floodway's final answer says it must not, so
    the SDK's retries never submit the same work again."""
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    kinds = {"chat": KindConfig(adapter="openai", base_url=dead, models=["gpt-4o-mini"],
                                max_attempts=2)}  # fmt: skip
    server = await start_api(keys=KEYS, kinds=kinds)
    sent: list[str] = []

    async def count(request: Any) -> None:
        sent.append(str(request.url))

    http_client = openai.DefaultAsyncHttpxClient(event_hooks={"request": [count]})
    client = openai.AsyncOpenAI(
        base_url=f"{server.url}/openai/v1", api_key="key-a", http_client=http_client
    )  # the SDK's defaults: max_retries = 2
    api_stack.push_async_callback(client.close)
    with pytest.raises(openai.APIStatusError) as failed:
        await client.chat.completions.create(model="gpt-4o-mini", messages=_ask("anyone?"))
    assert failed.value.status_code == 502
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert len(sent) == 1
    tasks = await server.fw.list_tasks(TaskQuery(tenant="tenant-a"))
    assert [t.status.value for t in tasks] == ["dead"] and tasks[0].attempts == 2


async def test_the_provider_gets_the_servers_key_never_the_tenants(
    start_api: StartApi, api_stack: AsyncExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-server-side")
    front = await start_front(start_api, api_stack, kind_options={"api_key_env": "OPENAI_API_KEY"})
    await front.sdk().chat.completions.create(model="gpt-4o-mini", messages=_ask("hi"))
    assert front.fake.authorizations == ["Bearer sk-server-side"]
