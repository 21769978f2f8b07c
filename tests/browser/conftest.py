"""Fixtures for the dashboard's browser tests: a real API server on a loopback port with tasks
in every state, and Debian's Chromium driven by Playwright.

Chromium comes from the distribution (``.ci/browser-deps.sh`` installs it), never from
Playwright's own download: the tests skip, saying why, when it is not there.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from floodway import Floodway, RetryableError
from floodway.api import create_app, serving
from floodway.config import (
    ApiConfig,
    BudgetConfig,
    PriceConfig,
    ResourceConfig,
    Settings,
    TenantConfig,
    WorkerConfig,
)
from floodway.context import Context
from floodway.testing import SimulatedProvider

try:
    from playwright.async_api import async_playwright
except ImportError:  # pragma: no cover - playwright is in the [test] extra
    async_playwright = None

#: where the screenshot tests leave their pictures: a run's temporary directory, unless
#: FLOODWAY_SCREENSHOTS names one (``FLOODWAY_SCREENSHOTS=docs/screenshots`` renews the
#: pictures the README shows; a plain test run leaves the checkout as it found it)
SCREENSHOTS_ENV = "FLOODWAY_SCREENSHOTS"


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    chosen = os.environ.get(SCREENSHOTS_ENV)
    folder = Path(chosen) if chosen else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TERMINAL = {"succeeded", "failed", "dead", "timeout", "cancelled", "deduped"}


def chromium_path() -> str | None:
    for candidate in (os.environ.get("FLOODWAY_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if await check():
                return
            await asyncio.sleep(0.05)


@dataclass
class Dash:
    """A served API with tasks in every state; ``ids`` names them by role."""

    url: str
    fw: Floodway
    app: FastAPI
    http: httpx.AsyncClient
    flip: SimulatedProvider
    ids: dict[str, list[str]] = field(default_factory=dict)

    async def stats(self) -> dict[str, Any]:
        response = await self.http.get("/v1/stats")
        response.raise_for_status()
        return dict(response.json())

    async def status(self, task_id: str) -> str:
        response = await self.http.get(f"/v1/tasks/{task_id}")
        response.raise_for_status()
        return str(response.json()["status"])

    async def submit(self, kind: str, inp: dict[str, Any], **extra: Any) -> str:
        response = await self.http.post("/v1/tasks", json={"kind": kind, "input": inp, **extra})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    async def settle(self, task_ids: list[str], statuses: set[str]) -> None:
        async def done() -> bool:
            return all([await self.status(t) in statuses for t in task_ids])

        await eventually(done)


async def busy(ctx: Context, inp: dict[str, Any]) -> dict[str, Any]:
    """Always busy, and asks for ten minutes: its tasks sit in ``retrying`` (or, with a short
    deadline, end in ``timeout``)."""
    raise RetryableError("upstream busy", retry_after=600.0)


async def chat(ctx: Context, inp: dict[str, Any]) -> dict[str, Any]:
    """A priced call: it reports the tokens it used, as a provider's answer would."""
    ctx.report_usage(inp["prompt"] + 100, input_tokens=inp["prompt"], output_tokens=100)
    return {"text": "ok"}


async def populate(dash: Dash) -> None:
    ids = dash.ids
    # Spend: two priced calls and the same work again (deduped: a saving).
    ids["chat"] = [await dash.submit("chat", {"prompt": p}) for p in (1000, 3000, 1000)]
    await dash.settle(ids["chat"], {"succeeded", "deduped"})
    ids["succeeded"] = [await dash.submit("sim", {"n": n}) for n in range(5)]
    ids["failed"] = [await dash.submit("sim", {"fail": "refusal"})]
    ids["dead"] = [await dash.submit("flip", {"n": n}, max_attempts=1) for n in range(3)]
    ids["timeout"] = [await dash.submit("busy", {}, deadline_s=60)]
    ids["retrying"] = [await dash.submit("busy", {}, deadline_s=3600)]
    await dash.settle(ids["succeeded"], {"succeeded"})
    await dash.settle(ids["failed"], {"failed"})
    await dash.settle(ids["dead"], {"dead"})
    await dash.settle(ids["timeout"], {"timeout"})
    await dash.settle(ids["retrying"], {"retrying"})
    # One slot on "slow-api": the first hour-long call runs, the next ones queue behind it.
    ids["running"] = [await dash.submit("slow", {"n": 0})]
    await dash.settle(ids["running"], {"running"})
    ids["queued"] = [await dash.submit("slow", {"n": 1})]
    ids["cancelled"] = [await dash.submit("slow", {"n": 2})]
    assert (await dash.http.delete(f"/v1/tasks/{ids['cancelled'][0]}")).status_code == 200
    await dash.settle(ids["cancelled"], {"cancelled"})
    assert await dash.status(ids["queued"][0]) == "queued"


StartDash = Callable[..., Awaitable[Dash]]


@pytest.fixture
async def start_dash(tmp_path: Path) -> AsyncIterator[StartDash]:
    """``await start_dash(keys={...})`` -> a served :class:`Dash` with tasks in every state
    (submitted with the first key's tenant when keys are given)."""
    async with AsyncExitStack() as stack:
        numbers = iter(range(1000))

        async def start(*, keys: dict[str, str] | None = None) -> Dash:
            settings = Settings(
                database=f"sqlite:///{tmp_path / f'dash-{next(numbers)}.db'}",
                api=ApiConfig(keys=keys or {}),
                # The hour-long call is cut at shutdown instead of being waited for.
                worker=WorkerConfig(grace=0.2),
                resources={
                    "slow-api": ResourceConfig(
                        concurrency=1, requests_per_minute=600, tokens_per_minute=100_000
                    ),
                    "llm": ResourceConfig(price=PriceConfig(input_per_1m=2.0, output_per_1m=8.0)),
                },
                tenants=TenantConfig(budget=BudgetConfig(amount=1.0)),
            )
            fw = Floodway(settings=settings)
            sim = SimulatedProvider(latency_s=0.01, seed=1)
            flip = SimulatedProvider(error_rate=1.0, seed=2)  # 5xx until a test says otherwise
            slow = SimulatedProvider(latency_s=3600.0)
            fw.kind("sim")(sim.handler)
            fw.kind("flip", max_attempts=1)(flip.handler)
            fw.kind("slow", resource="slow-api")(slow.handler)
            fw.kind("busy")(busy)
            fw.kind("chat", resource="llm", cost=lambda inp: inp["prompt"] + 100.0)(chat)
            app = create_app(
                fw, run_workers=True, concurrency=8, sse_recheck_s=0.2, stats_sample_s=0.25
            )
            url = await stack.enter_async_context(serving(app))
            headers = {"Authorization": f"Bearer {next(iter(keys))}"} if keys else {}
            http = await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0)
            )
            dash = Dash(url=url, fw=fw, app=app, http=http, flip=flip)
            await populate(dash)
            return dash

        yield start


@pytest.fixture
async def dash(start_dash: StartDash) -> Dash:
    """An open API (no keys) with tasks in every state."""
    return await start_dash()


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if async_playwright is None:
        pytest.skip("playwright is not installed: pip install -e '.[test]'")
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium: run .ci/browser-deps.sh (apt-get install chromium)")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@dataclass
class Watched:
    """A page and what it did: console errors, uncaught exceptions, every request."""

    page: Any
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def count(self, path: str) -> int:
        return sum(1 for url in self.requests if httpx.URL(url).path == path)


@pytest.fixture
async def open_page(browser: Any) -> AsyncIterator[Callable[..., Awaitable[Watched]]]:
    contexts = []

    async def open_page(
        url: str,
        *,
        wait_for: str | None = "#states .state-count[data-value]",
        routes: dict[str, Callable[[Any], Awaitable[None]]] | None = None,
    ) -> Watched:
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = await context.new_page()
        for pattern, handler in (routes or {}).items():  # before the first request
            await page.route(pattern, handler)
        watched = Watched(page)
        page.on(
            "console",
            lambda msg: (
                watched.errors.append(f"console: {msg.text}") if msg.type == "error" else None
            ),
        )
        page.on("pageerror", lambda exc: watched.errors.append(f"page error: {exc}"))
        page.on("request", lambda request: watched.requests.append(request.url))
        # The DOM, not the "load" event: that one also waits for every subresource, and
        # once timed out (30 s) on a loaded CI machine; wait_for below is what proves the
        # page works (its script ran and rendered the API's figures).
        await page.goto(url, wait_until="domcontentloaded")
        if wait_for:
            await page.wait_for_selector(wait_for)
        return watched

    yield open_page
    for context in contexts:
        await context.unroute_all(behavior="ignoreErrors")
        for page in context.pages:
            await page.unroute_all(behavior="ignoreErrors")
        await context.close()
