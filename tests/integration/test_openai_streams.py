"""``stream: true`` through ``/openai/v1``: a stream is a task like any other (limits,
retries before its first event, billing from its usage), kept with the task so that an
identical request joins it live and a later one replays it, billed once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import httpx
import openai
import pytest

from floodway import Task
from floodway.config import ResourceConfig
from floodway.providers.sim import SimulatorConfig
from floodway.store.base import SpendQuery, TaskQuery
from harness.processes import until
from tests.integration.conftest import StartApi
from tests.integration.openai_setup import SimFront, start_sim_front

ASK: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "one two three four five six"}],
}
WHOLE = "echo: one two three four five six"


def started(front: SimFront) -> Callable[[], Awaitable[bool]]:
    async def calling() -> bool:
        return front.sim.core.stats.in_flight > 0

    return calling


async def settled(front: SimFront, n: int) -> list[Task]:
    """The tenant's ``n`` tasks once each one's outcome is written: a stream ends at its last
    event (a usage chunk, an error), its task's outcome and spend land just after."""
    fw = front.server.fw

    async def written() -> bool:
        tasks = await fw.list_tasks(TaskQuery(tenant="tenant-a", limit=100))
        return len(tasks) == n and all(t.terminal for t in tasks)

    await until(written, 10, f"the outcomes of {n} streamed tasks written")
    return await fw.list_tasks(TaskQuery(tenant="tenant-a", limit=100))


def _text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_a_stream_comes_as_openai_sends_it_and_is_billed_from_its_usage(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack)
    chat = front.sdk().chat.completions
    plain = [c async for c in await chat.create(**ASK, stream=True)]
    assert _text(plain) == WHOLE
    assert all(c.usage is None for c in plain)  # floodway asked for usage; this client did not
    assert plain[-1].choices[0].finish_reason == "stop"
    counted = [
        c
        async for c in await chat.create(
            **ASK, stream=True, temperature=0.5, stream_options={"include_usage": True}
        )
    ]
    assert counted[-1].choices == [] and counted[-1].usage is not None
    assert counted[-1].usage.total_tokens == 14
    tasks = await settled(front, 2)
    assert [t.cost_actual for t in tasks] == [14.0, 14.0]  # settled from the usage chunk
    assert front.sim.core.ledger.total == 2 and front.sim.core.ledger.total_tokens == 28


async def test_an_identical_stream_joins_the_live_one_and_a_later_one_replays_it(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """temperature 0: deterministic, so the finished stream is replayed too."""
    config = SimulatorConfig(latency_ms=50, chunk_ms=40)
    front = await start_sim_front(start_api, api_stack, config)
    chat = front.sdk().chat.completions

    async def read() -> list[Any]:
        return [c async for c in await chat.create(**ASK, stream=True, temperature=0)]

    first = asyncio.create_task(read())
    await until(started(front), 10, "the first call started")
    joined = await read()
    later = await read()
    assert _text(await first) == _text(joined) == _text(later) == WHOLE
    assert front.sim.core.stats.requests == 1 and front.sim.core.ledger.total == 1


async def test_before_the_first_event_a_provider_failure_is_retried_unseen(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack, SimulatorConfig(latency_ms=1, seed=3))
    chat = front.sdk().chat.completions
    front.sim.core.config = front.sim.core.config.model_copy(update={"rate_limit_rate": 0.5})
    chunks = [c async for c in await chat.create(**ASK, stream=True)]
    assert _text(chunks) == WHOLE
    with pytest.raises(openai.BadRequestError) as refused:  # refused: a plain HTTP error
        await chat.create(**ASK, stream=True, metadata={"fail": "refusal"})
    assert refused.value.code == "content_policy_violation"


async def test_after_the_first_event_a_broken_stream_ends_with_an_error_event(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack)
    stream = await front.sdk().chat.completions.create(**ASK, stream=True, metadata={"fail": "cut"})
    received: list[Any] = []
    with pytest.raises(openai.APIError) as broken:
        async for chunk in stream:
            received.append(chunk)
    assert received and _text(received) != WHOLE  # the part that came, then the error
    assert "stream broke" in broken.value.message
    (task,) = await settled(front, 1)
    assert task.status.value == "failed" and task.attempts == 1  # not run again


async def test_a_waiting_stream_gets_keep_alive_comments_with_its_queue_position(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    config = SimulatorConfig(latency_ms=600, chunk_ms=1)
    front = await start_sim_front(
        start_api,
        api_stack,
        config,
        kind_options={"resource": "one"},
        resources={"one": ResourceConfig(concurrency=1)},
        api={"stream_keepalive": 0.1},
    )
    busy = asyncio.create_task(
        front.sdk().chat.completions.create(**ASK, stream=True, temperature=1.0)
    )
    await until(started(front), 10, "the busy call started")
    body = {**ASK, "stream": True, "temperature": 0.9}
    lines = []
    async with httpx.AsyncClient(base_url=front.server.url, timeout=30) as http:
        headers = {"Authorization": "Bearer key-a"}
        async with http.stream(
            "POST", "/openai/v1/chat/completions", json=body, headers=headers
        ) as answer:
            assert answer.headers["x-floodway-queue-position"] == "1"
            async for line in answer.aiter_lines():
                lines.append(line)
    assert lines[0] == ": queued, position 1" and lines[-2] == "data: [DONE]"
    await (await busy).close()


async def test_a_client_that_hangs_up_stops_nothing_and_its_retry_replays_the_stream(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_sim_front(start_api, api_stack, SimulatorConfig(latency_ms=1, chunk_ms=30))
    chat = front.sdk().chat.completions
    key = {"Idempotency-Key": "hang-up"}
    stream = await chat.create(**ASK, stream=True, extra_headers=key)
    async for _ in stream:
        break  # the client goes away after the first chunk
    await stream.close()
    (task,) = await front.server.fw.list_tasks(TaskQuery(tenant="tenant-a"))
    done = await front.server.fw.wait(task.id, timeout=30)
    assert done.status.value == "succeeded"  # the provider's stream was read to its end
    again = [c async for c in await chat.create(**ASK, stream=True, extra_headers=key)]
    assert _text(again) == WHOLE and front.sim.core.ledger.total == 1


async def test_fifty_streams_on_a_resource_capped_at_5_through_a_429_storm(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """50 concurrent SDK streams, a cap of 5, the first 10 provider answers 429: the provider
    never sees more than 5, no client sees a 429, every stream is whole, and the spend is
    what the provider's usage says."""
    config = SimulatorConfig(latency_ms=20, chunk_ms=2, max_concurrency=5)
    price = {"input_per_1m": 1.0, "output_per_1m": 2.0}
    front = await start_sim_front(
        start_api,
        api_stack,
        config,
        kind_options={"resource": "capped", "price": price},
        resources={"capped": ResourceConfig(concurrency=5)},
    )
    front.sim.storm(10)
    chat = front.sdk(timeout=60).chat.completions  # max_retries 0: a 429 that came would raise

    async def one(n: int) -> tuple[str, Any]:
        ask = {**ASK, "messages": [{"role": "user", "content": f"stream {n}"}]}
        chunks = [
            c
            async for c in await chat.create(
                **ask, stream=True, stream_options={"include_usage": True}
            )
        ]
        return _text(chunks), chunks[-1].usage

    done = await asyncio.gather(*(one(n) for n in range(50)))
    assert sorted(text for text, _ in done) == sorted(f"echo: stream {n}" for n in range(50))
    stats = front.sim.core.stats
    assert stats.peak_concurrency <= 5 and stats.rate_limited == 10
    assert front.sim.core.ledger.total == 50
    prompt = sum(u.prompt_tokens for _, u in done)
    completion = sum(u.completion_tokens for _, u in done)
    assert prompt + completion == front.sim.core.ledger.total_tokens
    await settled(front, 50)
    report = await front.server.fw.store.spend(SpendQuery(since=0))
    (line,) = report.lines
    assert (line.input_tokens, line.output_tokens, line.calls) == (prompt, completion, 50)
    assert line.cost == pytest.approx((prompt * 1.0 + completion * 2.0) / 1e6)
