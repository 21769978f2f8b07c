"""``floodway simulate --openai``: the official SDK against the OpenAI-compatible simulator,
its faults and its charge ledger."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from floodway.providers.sim import SimulatorConfig
from floodway.providers.sim.openai import create_openai_simulator_app
from floodway.serving import serve_app

ASK: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "a b c"}]}


async def _served(config: SimulatorConfig) -> AsyncIterator[tuple[str, openai.AsyncOpenAI]]:
    async with serve_app(create_openai_simulator_app(config)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", max_retries=0)
        try:
            yield url, client
        finally:
            await client.close()


@pytest.fixture
async def sim() -> AsyncIterator[tuple[str, openai.AsyncOpenAI]]:
    async for served in _served(SimulatorConfig(latency_ms=1, seed=1)):
        yield served


async def test_every_endpoint_family_answers_the_sdk_and_bills_its_ledger(
    sim: tuple[str, openai.AsyncOpenAI],
) -> None:
    url, client = sim
    whole = await client.chat.completions.with_raw_response.create(**ASK)
    assert whole.parse().choices[0].message.content == "echo: a b c"
    assert whole.headers["x-request-id"].startswith("req_")
    stream = await client.chat.completions.create(
        **ASK, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: a b c" and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 6
    assert (await client.embeddings.create(model="e", input=["x", "y"])).usage.total_tokens == 2
    assert len((await client.images.generate(model="dall-e-3", prompt="p", n=3)).data or []) == 3
    response = await client.responses.create(model="gpt-4o-mini", input="hi there")
    assert response.output_text == "echo: hi there"
    events = [e async for e in await client.responses.create(model="m", input="x", stream=True)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert [m.id async for m in client.models.list()][:1] == ["gpt-4o-mini"]
    async with httpx.AsyncClient(base_url=url) as http:
        ledger = (await http.get("/ledger")).json()
    assert ledger["total"] == 6 and ledger["double_charged"] == []


async def test_a_background_response_is_queued_at_once_then_kept(
    sim: tuple[str, openai.AsyncOpenAI],
) -> None:
    _, client = sim
    queued = await client.responses.create(model="m", input="later", background=True)
    assert queued.status == "queued"
    done = queued
    for _ in range(200):
        done = await client.responses.retrieve(queued.id)
        if done.status == "completed":
            break
    assert done.output_text == "echo: later"
    items = await client.responses.input_items.list(queued.id)
    assert [i.type for i in items.data] == ["message"]
    await client.responses.delete(queued.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(queued.id)


async def test_its_faults_and_limits_answer_as_openai_does() -> None:
    config = SimulatorConfig(latency_ms=1, max_concurrency=1, seed=1)
    async for url, client in _served(config):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(**ASK, metadata={"fail": "refusal"})
        assert refused.value.code == "content_policy_violation"
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(**ASK, metadata={"fail": "5xx"})
        with pytest.raises(openai.RateLimitError) as throttled:
            await client.chat.completions.create(**ASK, metadata={"fail": "429"})
        assert throttled.value.response.headers["retry-after-ms"]
        cut = await client.chat.completions.create(**ASK, stream=True, metadata={"fail": "cut"})
        pieces = [c async for c in cut]  # ends halfway: no finish_reason, no [DONE]
        assert pieces and all(c.choices[0].finish_reason is None for c in pieces)
        key = {"Idempotency-Key": "same-work"}
        first = await client.chat.completions.create(**ASK, extra_headers=key)
        again = await client.chat.completions.with_raw_response.create(**ASK, extra_headers=key)
        assert again.parse().id == first.id and again.headers["idempotent-replayed"] == "true"
        async with httpx.AsyncClient(base_url=url) as http:
            ledger = (await http.get("/ledger")).json()
            stats = (await http.get("/stats")).json()
        # billed: the cut stream (generated all the same) and the keyed call, once
        assert ledger["total"] == 2 and ledger["charges"]["same-work"] == 1
        assert stats["refusals"] == 1 and stats["rate_limited"] == 1
