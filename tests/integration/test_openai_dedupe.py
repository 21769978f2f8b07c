"""Dedupe that matches intent: identical requests in flight share one call; a finished result
is given to a new request only when the request is deterministic, carries the same
Idempotency-Key, is the SDK's own retry of it, or the kind says ``dedupe = "always"``."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

from harness.openai_fake import FakeOpenAI
from tests.integration.conftest import StartApi
from tests.integration.openai_setup import start_front

CHAT: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "a"}]}


async def test_regenerate_at_a_temperature_is_a_new_sample_while_temperature_0_is_replayed(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack)
    chat = front.sdk().chat.completions
    first = await chat.create(**CHAT, temperature=1.5)
    again = await chat.create(**CHAT, temperature=1.5)  # a "regenerate" button
    assert first.id != again.id and len(front.fake.billed) == 2
    zero = [await chat.create(**CHAT, temperature=0) for _ in range(2)]
    seeded = [await chat.create(**CHAT, seed=7) for _ in range(2)]
    assert zero[0].id == zero[1].id and seeded[0].id == seeded[1].id
    assert len(front.fake.billed) == 4
    keyed = [
        await chat.create(**CHAT, temperature=1.5, extra_headers={"Idempotency-Key": "k1"})
        for _ in range(2)
    ]
    assert keyed[0].id == keyed[1].id and len(front.fake.billed) == 5
    # The SDK's own retry of a request (X-Stainless-Retry-Count) wants that request's answer.
    retry = await chat.create(
        **CHAT, temperature=1.5, extra_headers={"X-Stainless-Retry-Count": "1"}
    )
    assert retry.id == keyed[0].id and len(front.fake.billed) == 5  # the latest sample


async def test_identical_sampled_requests_in_flight_share_one_call(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack, fake=FakeOpenAI(latency_s=0.3))
    chat = front.sdk().chat.completions
    answers = await asyncio.gather(*(chat.create(**CHAT, temperature=1.0) for _ in range(3)))
    assert len({a.id for a in answers}) == 1 and len(front.fake.billed) == 1


async def test_a_kind_with_dedupe_always_replays_any_finished_request(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack, kind_options={"dedupe": "always"})
    chat = front.sdk().chat.completions
    first, again = [await chat.create(**CHAT, temperature=1.5) for _ in range(2)]
    assert first.id == again.id and len(front.fake.billed) == 1
    images = front.sdk().images
    await images.generate(model="dall-e-3", prompt="a chair")
    await images.generate(model="dall-e-3", prompt="a chair")
    assert len(front.fake.billed) == 2


async def test_an_image_is_a_sample_and_an_embedding_is_replayed(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack)
    client = front.sdk()
    for _ in range(2):
        await client.images.generate(model="dall-e-3", prompt="a chair")
        await client.embeddings.create(model="text-embedding-3-small", input="a chair")
    assert [b.endpoint for b in front.fake.billed] == ["images", "embeddings", "images"]
