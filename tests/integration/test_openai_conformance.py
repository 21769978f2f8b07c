"""The official ``openai`` SDK's synchronous client against the front, endpoint by endpoint,
as a user's script would call it (the async client is the other tests'): whole and streamed
answers, the raw response's headers, typed errors, and the SDK's own retries."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from typing import Any

import openai
import pytest

from floodway.config import ResourceConfig
from floodway.providers.sim import SimulatorConfig
from tests.integration.conftest import StartApi
from tests.integration.openai_setup import SimFront, start_sim_front

HI: list[Any] = [{"role": "user", "content": "hi there"}]


def _script(front: SimFront) -> dict[str, Any]:
    """Every served endpoint with the synchronous client; what each answered."""
    client = openai.OpenAI(base_url=f"{front.server.url}/openai/v1", api_key="key-a")
    seen: dict[str, Any] = {}
    with client:
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=HI)
        seen["chat"] = raw.parse().choices[0].message.content
        seen["headers"] = dict(raw.headers)
        seen["stream"] = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(model="gpt-4o", messages=HI, stream=True)
            if c.choices
        )
        seen["embedding"] = len(
            client.embeddings.create(model="text-embedding-3-small", input="x").data[0].embedding
        )
        seen["images"] = len(client.images.generate(model="dall-e-3", prompt="p", n=2).data or [])
        seen["models"] = sorted(m.id for m in client.models.list())
        seen["model"] = client.models.retrieve("gpt-4o").id
        response = client.responses.create(model="gpt-4.1-mini", input="hello")
        seen["response"] = client.responses.retrieve(response.id).output_text
        seen["response_events"] = [
            e.type for e in client.responses.create(model="gpt-4.1-mini", input="x", stream=True)
        ][-1]
        seen["input_items"] = len(client.responses.input_items.list(response.id).data)
        client.responses.delete(response.id)
        line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "gpt-4o-mini", "messages": HI}}  # fmt: skip
        uploaded = client.files.create(
            file=("in.jsonl", json.dumps(line).encode()), purpose="batch"
        )
        seen["file"] = client.files.retrieve(uploaded.id).purpose
        seen["file_content"] = client.files.content(uploaded.id).text
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        seen["batches"] = [b.id for b in client.batches.list()] == [batch.id]
        seen["batch"] = client.batches.retrieve(batch.id).endpoint
        for call, error in (
            (lambda: client.chat.completions.create(model="gpt-9", messages=HI), "not_found"),
            (lambda: client.chat.completions.create(model="gpt-4o", messages=[]), "bad"),
            (lambda: client.files.retrieve("file-nope"), "not_found"),
        ):
            try:
                call()
            except openai.NotFoundError:
                seen[error] = "NotFoundError"
            except openai.BadRequestError:
                seen[error] = "BadRequestError"
        try:
            openai.OpenAI(base_url=client.base_url, api_key="nope").models.list()
        except openai.AuthenticationError as exc:
            seen["unauthorized"] = exc.status_code
    return seen


async def test_the_synchronous_sdk_on_every_served_endpoint(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(
        start_api,
        api_stack,
        kind_options={"resource": "openai"},
        resources={"openai": ResourceConfig(requests_per_minute=1200)},
    )
    seen = await asyncio.to_thread(_script, front)
    assert seen["chat"] == "echo: hi there" and seen["stream"] == "echo: hi there"
    assert seen["headers"]["x-request-id"] == seen["headers"]["x-floodway-task"]
    assert seen["headers"]["x-ratelimit-limit-requests"] == "1200"
    assert (seen["embedding"], seen["images"], seen["model"]) == (4, 2, "gpt-4o")
    assert "gpt-4.1-mini" in seen["models"]
    assert seen["response"] == "echo: hello" and seen["response_events"] == "response.completed"
    assert seen["input_items"] == 1 and seen["file"] == "batch" and seen["batches"]
    assert json.loads(seen["file_content"])["custom_id"] == "a"
    assert seen["batch"] == "/v1/chat/completions"
    assert (seen["not_found"], seen["bad"]) == ("NotFoundError", "BadRequestError")
    assert seen["unauthorized"] == 401


async def test_the_sdks_own_retry_after_a_429_collects_the_same_work(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """A client timeout shorter than the call: floodway answers 429 before it, the SDK waits
    out retry-after-ms and asks again (its default max_retries), and gets the one call's
    answer."""
    front = await start_sim_front(start_api, api_stack, SimulatorConfig(latency_ms=2500))

    def call() -> tuple[str | None, int]:
        with openai.OpenAI(
            base_url=f"{front.server.url}/openai/v1", api_key="key-a", timeout=2.0
        ) as client:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=HI, temperature=1.0
            )
            return raw.parse().choices[0].message.content, raw.retries_taken

    content, retries = await asyncio.to_thread(call)
    assert content == "echo: hi there" and retries >= 1
    assert front.sim.core.ledger.total == 1


async def test_a_stream_the_client_times_out_on_raises_the_sdks_timeout(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack, SimulatorConfig(latency_ms=1, chunk_ms=800))
    client = front.sdk(timeout=0.4)
    with pytest.raises(openai.APITimeoutError):
        async for _ in await client.chat.completions.create(
            model="gpt-4o-mini", messages=HI, stream=True
        ):
            pass
