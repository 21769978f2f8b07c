"""The provider's request id of a task's call (OpenAI's ``x-request-id``, Anthropic's
``request-id``): kept with the task on both ledgers, shown in the task's JSON and, through
the OpenAI front, as ``x-upstream-request-id`` on plain, streamed, Responses and error
answers; a joined or replayed answer names the call that did the work."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import openai
import pytest

from floodway import Floodway, Settings, Status
from floodway.core.backoff import Backoff
from floodway.core.retry import RetryPolicy
from floodway.providers.registry import aclose_kinds
from floodway.providers.sim import SimulatorConfig, serve_app
from floodway.providers.sim.anthropic import create_anthropic_simulator_app
from harness.processes import until
from tests.integration.conftest import StartApi
from tests.integration.openai_setup import SimFront, start_sim_front

UPSTREAM = "x-upstream-request-id"
KEY_ENV = "FW_TEST_ANTHROPIC_KEY"
ASK: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "one two three"}],
}


async def _task_json(front: SimFront, task_id: str) -> dict[str, Any]:
    http = await front.server.client("key-a")
    answer = await http.get(f"/v1/tasks/{task_id}")
    assert answer.status_code == 200
    body: dict[str, Any] = answer.json()
    return body


async def test_a_plain_call_names_the_providers_answer_and_a_replay_names_the_same_call(
    start_api: StartApi, api_stack: AsyncExitStack, ledger_url: str
) -> None:
    front = await start_sim_front(start_api, api_stack, database=ledger_url)
    chat = front.sdk().chat.completions.with_raw_response
    raw = await chat.create(**ASK, temperature=0)
    upstream = raw.headers[UPSTREAM]
    assert upstream == front.request_ids[-1]  # the provider's own, not floodway's
    assert raw.headers["x-request-id"] == raw.headers["x-floodway-task"] != upstream
    task_id = raw.headers["x-floodway-task"]
    assert (await _task_json(front, task_id))["upstream_request_id"] == upstream
    assert (await front.server.fw.get(task_id)).upstream_request_id == upstream
    replayed = await chat.create(**ASK, temperature=0)  # deterministic: takes the result
    assert replayed.headers["x-floodway-task"] != task_id
    assert replayed.headers[UPSTREAM] == upstream
    assert front.sim.core.ledger.total == 1


async def test_a_call_joined_in_flight_names_the_call_that_did_its_work(
    start_api: StartApi, api_stack: AsyncExitStack, ledger_url: str
) -> None:
    config = SimulatorConfig(latency_ms=300)
    front = await start_sim_front(start_api, api_stack, config, database=ledger_url)
    chat = front.sdk().chat.completions.with_raw_response
    first = asyncio.create_task(chat.create(**ASK, temperature=0.7))

    async def calling() -> bool:
        return front.sim.core.stats.in_flight > 0

    await until(calling, 10, "the first call started")
    joined = await chat.create(**ASK, temperature=0.7)  # in flight: joined, whatever sample
    owner = await first
    assert joined.headers["x-floodway-task"] != owner.headers["x-floodway-task"]
    assert joined.headers[UPSTREAM] == owner.headers[UPSTREAM] == front.request_ids[-1]
    assert front.sim.core.ledger.total == 1


async def test_a_stream_a_response_and_an_error_name_the_providers_answer(
    start_api: StartApi, api_stack: AsyncExitStack, ledger_url: str
) -> None:
    front = await start_sim_front(start_api, api_stack, database=ledger_url)
    client = front.sdk()
    streamed = await client.chat.completions.with_raw_response.create(**ASK, stream=True)
    chunks = [c async for c in streamed.parse()]
    assert chunks and streamed.headers[UPSTREAM] == front.request_ids[-1]
    task = await front.server.fw.get(streamed.headers["x-floodway-task"])
    assert task.upstream_request_id == streamed.headers[UPSTREAM]

    responded = await client.responses.with_raw_response.create(
        model="gpt-4.1-mini", input="one two three"
    )
    assert responded.headers[UPSTREAM] == front.request_ids[-1]

    with pytest.raises(openai.BadRequestError) as refused:  # the provider's 400, fatal
        await client.chat.completions.create(**ASK, metadata={"fail": "refusal"})
    assert refused.value.response.headers[UPSTREAM] == front.request_ids[-1]


@pytest.fixture
async def anthropic(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, Any]]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    app = create_anthropic_simulator_app(SimulatorConfig(latency_ms=0, seed=3))
    async with serve_app(app) as url:
        yield url, app


async def test_an_anthropic_task_keeps_the_request_id_of_its_last_answer_error_or_not(
    anthropic: tuple[str, Any], ledger_url: str
) -> None:
    url, app = anthropic
    sim, sent = app.state.simulator, app.state.request_ids
    config = {"adapter": "anthropic", "base_url": url, "api_key_env": KEY_ENV,
              "model": "claude-haiku-4-5", "max_output_tokens": 64}  # fmt: skip
    fw = Floodway(
        settings=Settings(database=ledger_url, kinds={"chat": config}),
        policy=RetryPolicy(backoff=Backoff(base_s=0.01, cap_s=0.05)),
    )
    sim.storm(1, "overloaded_error", retry_after_s=0.01)
    try:
        async with fw, fw.worker(concurrency=2):
            ok = await fw.wait((await fw.submit("chat", {"messages": ASK["messages"]})).id, 30)
            assert ok.status is Status.SUCCEEDED
            assert len(sent) == 2 and ok.upstream_request_id == sent[-1]  # not the 529's
            bad = await fw.wait((await fw.submit("chat", {"messages": []})).id, 30)
            assert bad.status is Status.FAILED and bad.upstream_request_id == sent[-1]
    finally:
        await aclose_kinds(fw.kinds)
