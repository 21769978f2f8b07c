"""Fixtures for the HTTP API: a Floodway on a temporary SQLite file, served by a real uvicorn
server on a loopback port inside the test's event loop."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from floodway import Floodway
from floodway.api import create_app, serving
from floodway.config import (
    ApiConfig,
    CallbacksConfig,
    KindConfig,
    ResourceConfig,
    Settings,
    TenantConfig,
)
from floodway.testing import SimulatedProvider
from harness.pg import fresh_schema, postgres_unavailable, schema_url

#: outbound webhooks retried fast, so tests wait on events, never on long sleeps
FAST_CALLBACKS = CallbacksConfig(max_attempts=8, backoff=0.01, max_backoff=0.05)


@dataclass
class ApiServer:
    url: str
    fw: Floodway
    app: FastAPI
    provider: SimulatedProvider
    stack: AsyncExitStack = field(repr=False)

    async def client(self, key: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        """An httpx client on the server (closed before the server stops)."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30.0, **kwargs)
        return await self.stack.enter_async_context(client)


StartApi = Callable[..., Awaitable[ApiServer]]


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    """Until ``check()`` holds; the timeout is a guard against hangs, not a measurement."""
    async with asyncio.timeout(timeout):
        while True:
            if await check():
                return
            await asyncio.sleep(0.02)


@pytest.fixture
async def api_stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


@pytest.fixture
def start_api(tmp_path: Path, api_stack: AsyncExitStack) -> StartApi:
    """``await start_api(keys=..., tenants=..., run_workers=...)`` -> a served :class:`ApiServer`.

    Every server gets the kind ``sim`` (a SimulatedProvider with 10 ms latency); ``kinds``
    adds config kinds (e.g. with a ``webhook_secret``) whose handlers ``handlers`` gives.
    """
    numbers = itertools.count()

    async def start(
        *,
        keys: dict[str, str] | None = None,
        tenants: dict[str, Any] | None = None,
        api: dict[str, Any] | None = None,
        kinds: dict[str, KindConfig] | None = None,
        resources: dict[str, ResourceConfig] | None = None,
        handlers: dict[str, Any] | None = None,
        run_workers: bool = True,
        redis: str = "",
        sse_recheck_s: float = 0.2,
        configure: Callable[[Floodway, FastAPI], None] | None = None,
        database: str | None = None,
    ) -> ApiServer:
        settings = Settings(
            database=database or f"sqlite:///{tmp_path / f'api-{next(numbers)}.db'}",
            api=ApiConfig(keys=keys or {}, **(api or {})),
            tenants=TenantConfig(**(tenants or {})),
            kinds=kinds or {},
            resources=resources or {},
            redis=redis,
            callbacks=FAST_CALLBACKS,
        )
        fw = Floodway(settings=settings)
        provider = SimulatedProvider(latency_s=0.01)
        fw.kind("sim")(provider.handler)
        for name, handler in (handlers or {}).items():
            fw.kind(name)(handler)
        app = create_app(
            fw,
            run_workers=run_workers,
            concurrency=8,
            sse_recheck_s=sse_recheck_s,
        )
        if configure is not None:
            configure(fw, app)
        url = await api_stack.enter_async_context(serving(app))
        return ApiServer(url=url, fw=fw, app=app, provider=provider, stack=api_stack)

    return start


@pytest.fixture
async def api(start_api: StartApi) -> ApiServer:
    """An open API (no keys) with workers running."""
    return await start_api()


@pytest.fixture
async def http(api: ApiServer) -> httpx.AsyncClient:
    return await api.client()


@pytest.fixture(params=["sqlite", "postgres"])
async def ledger_url(request: pytest.FixtureRequest, db_url: str) -> AsyncIterator[str]:
    """The test's ledger on each backend (PostgreSQL: a fresh schema, dropped after)."""
    if request.param == "sqlite":
        yield db_url
        return
    if (down := postgres_unavailable()) is not None:
        pytest.skip(down)
    async with fresh_schema() as schema:
        yield schema_url(schema)
