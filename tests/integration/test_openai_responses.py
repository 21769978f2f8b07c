"""The Responses API through ``/openai/v1``, with the official SDK: plain, streamed and
background responses under floodway's ids, resumed by event number, cancelled, deleted."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import openai
import pytest

from floodway.providers.sim import SimulatorConfig
from harness.processes import until
from tests.integration.conftest import StartApi
from tests.integration.openai_setup import start_sim_front

MODEL = "gpt-4.1-mini"  # served by a kind with endpoint = "responses"


async def test_a_response_is_answered_kept_listed_and_deleted(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack)
    client = front.sdk()
    first = await client.responses.create(model=MODEL, input="hello there")
    assert first.output_text == "echo: hello there" and first.id.startswith("resp_t_")
    assert (await client.responses.retrieve(first.id)).output_text == "echo: hello there"
    items = await client.responses.input_items.list(first.id)
    assert [i.type for i in items.data] == ["message"]
    follow = await client.responses.create(model=MODEL, input="more", previous_response_id=first.id)
    # the provider was told its own id for the earlier response, not floodway's
    assert follow.previous_response_id is not None and follow.previous_response_id != first.id
    assert follow.previous_response_id.startswith("resp_")
    await client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)
    assert front.sim.core.ledger.total == 2


async def test_a_streamed_response_sends_openais_events_under_floodways_id(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack)
    stream = await front.sdk().responses.create(model=MODEL, input="a b c", stream=True)
    events = [e async for e in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    done = events[-1].response  # type: ignore[union-attr]
    assert done.id.startswith("resp_t_") and done.output_text == "echo: a b c"
    assert done.usage is not None and done.usage.total_tokens > 0


async def test_a_background_response_is_queued_at_once_polled_then_resumed_by_number(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack, SimulatorConfig(latency_ms=200))
    client = front.sdk()
    queued = await client.responses.create(model=MODEL, input="later on", background=True)
    assert queued.status == "queued" and queued.background
    done = await front.server.fw.wait(queued.id.removeprefix("resp_"), timeout=30)
    assert done.status.value == "succeeded"
    polled = await client.responses.retrieve(queued.id)
    assert polled.status == "completed" and polled.output_text == "echo: later on"
    resumed = await client.responses.retrieve(queued.id, stream=True, starting_after=3)
    numbers = [e.sequence_number async for e in resumed]
    assert numbers and numbers[0] == 4 and numbers == list(range(4, 4 + len(numbers)))
    assert front.sim.core.ledger.total == 1  # polled and resumed: billed once


async def test_a_background_response_can_be_cancelled_and_chat_only_models_are_refused(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack, SimulatorConfig(latency_ms=5000))
    client = front.sdk()
    queued = await client.responses.create(model=MODEL, input="never", background=True)
    cancelled = await client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="gpt-4o-mini", input="hi")  # a chat kind's model
    assert refused.value.code == "responses-unsupported"
    assert 'endpoint = "responses"' in refused.value.message


async def test_a_batch_of_responses_lines_is_answered_once_per_line(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack)
    client = front.sdk()
    lines = [
        {"custom_id": f"r{n}", "method": "POST", "url": "/v1/responses",
         "body": {"model": MODEL, "input": f"line {n}"}}
        for n in range(3)
    ]  # fmt: skip
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = await client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h"
    )

    async def completed() -> bool:
        return (await client.batches.retrieve(batch.id)).status == "completed"

    await until(completed, 30, "the batch completed")
    done = await client.batches.retrieve(batch.id)
    assert done.output_file_id is not None
    output = (await client.files.content(done.output_file_id)).text
    answers = {
        json.loads(line)["custom_id"]: json.loads(line)["response"]["body"]["output"][0]
        for line in output.splitlines()
    }
    assert sorted(answers) == ["r0", "r1", "r2"] and front.sim.core.ledger.total == 3
