"""The anthropic adapter's sync Messages calls against ``floodway simulate --anthropic``'s app
on loopback: what it sends, what it bills, and how each of Anthropic's errors is read."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from floodway import FatalError, Floodway, InvalidInput, RetryableError, Settings, Status
from floodway.core.backoff import Backoff
from floodway.core.hangup import Provider
from floodway.core.retry import RetryPolicy
from floodway.kinds import KindSpec
from floodway.limits.headers import read_quotas
from floodway.providers.registry import aclose_kinds
from floodway.providers.sim import SimulatorConfig, serve_app
from floodway.providers.sim.anthropic import create_anthropic_simulator_app
from floodway.providers.sim.anthropic.calls import AnthropicSimulator
from floodway.store.base import SpendQuery
from tests.integration.test_providers_http import build, close, make_ctx

KEY_ENV = "FW_TEST_ANTHROPIC_KEY"
PRICE = {"input_per_1m": 3.0, "output_per_1m": 15.0}
ASK = {"messages": [{"role": "user", "content": "name three rivers"}]}


@pytest.fixture
async def anthropic(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[str, AnthropicSimulator]]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    config = getattr(request, "param", {})
    app = create_anthropic_simulator_app(SimulatorConfig(latency_ms=0, seed=3, **config))
    async with serve_app(app) as url:
        yield url, app.state.simulator


def kind(url: str, **extra: Any) -> KindSpec:
    settings: dict[str, Any] = {"adapter": "anthropic", "base_url": url, "api_key_env": KEY_ENV,
                                "model": "claude-haiku-4-5", "max_output_tokens": 64}  # fmt: skip
    return build(**{**settings, **extra})


async def call(spec: KindSpec, value: Any) -> tuple[Any, Any]:
    ctx = make_ctx()
    try:
        return await spec.handler(ctx, value), ctx
    finally:
        await close(spec)


async def test_a_message_is_the_result_its_usage_billed_with_the_kinds_model_and_max_tokens(
    anthropic: tuple[str, AnthropicSimulator],
) -> None:
    url, sim = anthropic
    message, ctx = await call(kind(url), ASK)
    assert message["type"] == "message" and message["model"] == "claude-haiku-4-5"
    assert message["content"] == [{"type": "text", "text": "echo: name three rivers"}]
    usage = message["usage"]
    assert ctx.billed.input_tokens == usage["input_tokens"]
    assert ctx.billed.output_tokens == usage["output_tokens"]
    assert ctx.usage == usage["input_tokens"] + usage["output_tokens"]
    # the simulator refuses a call without x-api-key or anthropic-version: both were sent
    assert sim.sync.as_dict() == {"calls": 1, "input_tokens": usage["input_tokens"],
                                  "output_tokens": usage["output_tokens"]}  # fmt: skip


@pytest.mark.parametrize("anthropic", [{"rpm": 100}], indirect=True)
async def test_the_anthropic_ratelimit_headers_are_kept_for_the_limiter(
    anthropic: tuple[str, AnthropicSimulator],
) -> None:
    url, _ = anthropic
    _, ctx = await call(kind(url), ASK)
    headers = ctx.response_headers
    assert headers["anthropic-ratelimit-requests-limit"] == "100"
    assert headers["anthropic-ratelimit-requests-remaining"] == "99"
    [quota] = read_quotas(headers, time.time())
    assert (quota.dimension, quota.limit, quota.remaining) == ("requests", 100, 99)
    assert quota.reset_s is not None and quota.reset_s > 0  # a time a minute on, read back


@pytest.mark.parametrize(
    ("storm", "status", "kind_"),
    [("rate_limit_error", 429, "rate_limit_error"), ("overloaded_error", 529, "overloaded_error")],
)
async def test_a_429_and_a_529_throttle_with_the_providers_wait_and_bill_nothing(
    anthropic: tuple[str, AnthropicSimulator], storm: str, status: int, kind_: str
) -> None:
    url, sim = anthropic
    sim.storm(1, storm, retry_after_s=2)
    with pytest.raises(RetryableError) as caught:
        await call(kind(url), ASK)
    error = caught.value
    assert (error.status, error.error_type, error.throttled) == (status, kind_, True)
    assert error.retry_after == 2.0
    assert sim.sync.calls == 0


@pytest.mark.parametrize("anthropic", [{"error_rate": 1.0}], indirect=True)
async def test_a_500_is_retried_without_throttling(
    anthropic: tuple[str, AnthropicSimulator],
) -> None:
    url, sim = anthropic
    with pytest.raises(RetryableError) as caught:
        await call(kind(url), ASK)
    assert (caught.value.status, caught.value.error_type) == (500, "api_error")
    assert not caught.value.throttled and sim.sync.calls == 0


async def test_an_invalid_request_and_a_missing_key_are_fatal_with_anthropics_reason(
    anthropic: tuple[str, AnthropicSimulator],
) -> None:
    url, sim = anthropic
    with pytest.raises(FatalError) as invalid:
        await call(kind(url), {"messages": []})
    assert (invalid.value.status, invalid.value.error_type) == (400, "invalid_request_error")
    with pytest.raises(FatalError) as unauthenticated:
        await call(kind(url, api_key_env=None), ASK)
    assert unauthenticated.value.status == 401
    assert unauthenticated.value.error_type == "authentication_error"
    assert sim.sync.calls == 0


def test_the_estimate_is_the_prompt_over_four_plus_max_tokens_which_is_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    spec = kind("http://127.0.0.1:9")
    request = {"system": "s" * 40, "messages": [{"role": "user", "content": "x" * 396}]}
    assert spec.estimate(request) == (40 + 396 + len("user")) // 4 + 64
    assert spec.estimate({**request, "max_tokens": 1000}) == (40 + 396 + 4) // 4 + 1000
    with pytest.raises(InvalidInput, match="max_tokens is required"):
        kind("http://127.0.0.1:9", max_output_tokens=None).estimate(request)
    # Anthropic takes no idempotency key and has no look-up: a hung-up call is never resent
    assert spec.provider is Provider.NEITHER and not spec.idempotent


async def test_a_task_through_a_429_and_a_529_is_answered_once_and_its_spend_is_the_bill(
    anthropic: tuple[str, AnthropicSimulator], db_url: str
) -> None:
    url, sim = anthropic
    sim.storm(1, "rate_limit_error", retry_after_s=0.05)
    sim.storm(1, "overloaded_error", retry_after_s=0.05)
    config = {"adapter": "anthropic", "base_url": url, "api_key_env": KEY_ENV,
              "model": "claude-haiku-4-5", "max_output_tokens": 64, "price": PRICE}  # fmt: skip
    fw = Floodway(
        settings=Settings(database=db_url, kinds={"chat": config}),
        policy=RetryPolicy(backoff=Backoff(base_s=0.01, cap_s=0.05)),
    )
    try:
        async with fw, fw.worker(concurrency=4):
            task = await fw.submit("chat", ASK)
            done = await fw.wait(task.id, timeout=30)
            report = await fw.runtime.store.spend(SpendQuery(since=0.0))
    finally:
        await aclose_kinds(fw.kinds)
    async with httpx.AsyncClient(base_url=url) as http:
        ledger = (await http.get("/ledger")).json()
    assert done.status == Status.SUCCEEDED
    assert sim.core.stats.rate_limited == 2 and ledger["sync"]["calls"] == 1
    billed = (ledger["sync"]["input_tokens"] * PRICE["input_per_1m"]
              + ledger["sync"]["output_tokens"] * PRICE["output_per_1m"]) / 1e6  # fmt: skip
    assert abs(sum(line.cost for line in report.lines) - billed) < 1e-12
