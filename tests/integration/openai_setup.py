"""A floodway API whose kinds call an OpenAI-compatible fake, and the official ``openai``
SDK pointed at it (the way a user would: ``base_url`` and a floodway API key)."""

from __future__ import annotations

from collections import deque
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import openai

from floodway.api import serving
from floodway.config import KindConfig
from floodway.providers.sim import SimulatorConfig
from floodway.providers.sim.openai import create_openai_simulator_app
from floodway.providers.sim.openai.calls import OpenAISimulator
from harness.openai_fake import FakeOpenAI
from tests.integration.conftest import ApiServer, StartApi

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}


@dataclass
class OpenAIFront:
    server: ApiServer
    fake: FakeOpenAI

    def sdk(self, key: str = "key-a", **kwargs: Any) -> openai.AsyncOpenAI:
        """The SDK as a user configures it; no retries of its own unless asked, so a 429 or
        an error that reached it would show."""
        kwargs.setdefault("max_retries", 0)
        client = openai.AsyncOpenAI(base_url=f"{self.server.url}/openai/v1", api_key=key, **kwargs)
        # Closed before the server stops: an open pool left to the garbage collector closes
        # itself at whatever moment the collector runs.
        self.server.stack.push_async_callback(client.close)
        return client


def kinds(upstream: str, **extra: Any) -> dict[str, KindConfig]:
    base = {"adapter": "openai", "base_url": f"{upstream}/v1", **extra}
    return {
        "chat": KindConfig(endpoint="chat", models=["gpt-4o-mini", "gpt-4o"], **base),
        "embed": KindConfig(endpoint="embeddings", models=["text-embedding-3-small"], **base),
        "draw": KindConfig(endpoint="images", models=["dall-e-3"], **base),
        "respond": KindConfig(endpoint="responses", models=["gpt-4.1-mini"], **base),
    }


async def start_front(
    start_api: StartApi,
    stack: AsyncExitStack,
    *,
    fake: FakeOpenAI | None = None,
    kind_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> OpenAIFront:
    """The fake upstream, then floodway (``kwargs`` go to ``start_api``) in front of it."""
    fake = fake or FakeOpenAI()
    upstream = await stack.enter_async_context(serving(fake.app()))
    server = await start_api(keys=KEYS, kinds=kinds(upstream, **(kind_options or {})), **kwargs)
    return OpenAIFront(server, fake)


@dataclass
class SimFront:
    """floodway in front of ``floodway simulate --openai`` (its state: ``sim``)."""

    server: ApiServer
    sim: OpenAISimulator
    url: str  # the simulator's
    #: the simulator's latest x-request-ids, the last one sent last
    request_ids: deque[str]

    def sdk(self, key: str = "key-a", **kwargs: Any) -> openai.AsyncOpenAI:
        return OpenAIFront(self.server, FakeOpenAI()).sdk(key, **kwargs)


async def start_sim_front(
    start_api: StartApi,
    stack: AsyncExitStack,
    config: SimulatorConfig | None = None,
    *,
    kind_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> SimFront:
    """The OpenAI-compatible simulator, then floodway (``kwargs`` go to ``start_api``)."""
    app = create_openai_simulator_app(config or SimulatorConfig(latency_ms=1))
    upstream = await stack.enter_async_context(serving(app))
    server = await start_api(keys=KEYS, kinds=kinds(upstream, **(kind_options or {})), **kwargs)
    return SimFront(server, app.state.simulator, upstream, app.state.request_ids)
