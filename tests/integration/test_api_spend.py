"""``/v1/spend``, spend in ``/v1/stats`` and ``/metrics``, and the 402 of a budget, over HTTP:
a tenant sees only its own spend, an operator everyone's, a refused submit writes nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from floodway import BudgetExceeded, Client, Context, Floodway, Settings
from floodway.api import create_app, serving
from floodway.config import (
    ApiConfig,
    BudgetConfig,
    NamedTenantConfig,
    PriceConfig,
    ResourceConfig,
    TenantConfig,
)
from tests.integration.conftest import eventually

KEYS = {"key-a": "a", "key-b": "b"}
ADMIN = {"key-ops": "ops"}
#: 2.00 per million input tokens, 8.00 per million output tokens, 0.001 a request
PRICE = PriceConfig(input_per_1m=2.0, output_per_1m=8.0, per_request=0.001)


def cost(prompt: int, completion: int) -> float:
    return 0.001 + prompt * 2.0 / 1e6 + completion * 8.0 / 1e6


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, Floodway]]:
    settings = Settings(
        database=f"sqlite:///{tmp_path}/spend.db",
        api=ApiConfig(keys=KEYS, admin_keys=ADMIN),
        resources={"llm": ResourceConfig(price=PRICE)},
        # b may spend 0.01 a day: a 1,000-token estimate (0.009) fits once, not twice
        tenants=TenantConfig(named={"b": NamedTenantConfig(budget=BudgetConfig(amount=0.01))}),
    )
    fw = Floodway(settings=settings)

    @fw.kind("chat", resource="llm", cost=lambda value: float(value["max_tokens"]))
    async def chat(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        ctx.report_usage(
            value["prompt"] + value["completion"],
            input_tokens=value["prompt"],
            output_tokens=value["completion"],
        )
        return {"ok": True}

    async with serving(create_app(fw, run_workers=True, concurrency=4)) as url:
        yield url, fw


def client(url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"})


def chat_input(n: int, prompt: int = 100, completion: int = 50) -> dict[str, Any]:
    return {"n": n, "prompt": prompt, "completion": completion, "max_tokens": 1000}


async def run(http: httpx.AsyncClient, fw: Floodway, inputs: list[dict[str, Any]]) -> None:
    ids = []
    for value in inputs:
        answer = await http.post("/v1/tasks", json={"kind": "chat", "input": value})
        assert answer.status_code == 202, answer.text
        ids.append(answer.json()["id"])

    async def ended() -> bool:
        return all([(await fw.get(i)).terminal for i in ids])

    await eventually(ended)


async def test_each_tenant_sees_its_own_spend_and_an_operator_everyone_s(
    server: tuple[str, Floodway],
) -> None:
    url, fw = server
    async with client(url, "key-a") as a, client(url, "key-b") as b, client(url, "key-ops") as ops:
        await run(a, fw, [chat_input(1), chat_input(2, 300, 20), chat_input(1)])  # one deduped
        await run(b, fw, [chat_input(1)])
        mine = (await a.get("/v1/spend")).json()
        theirs = await b.get("/v1/spend", params={"tenant": "a"})
        nobody = await b.get("/v1/spend", params={"tenant": "nobody"})
        everyone = (await ops.get("/v1/spend", params={"kind": "chat", "since": "1h"})).json()
        stats = (await a.get("/v1/stats")).json()
        metrics = (await ops.get("/metrics")).text
    spent_a = cost(100, 50) + cost(300, 20)
    assert mine["cost"] == pytest.approx(spent_a)
    assert mine["saved"] == pytest.approx(cost(100, 50))
    ((line,), budgets) = mine["lines"], mine["budgets"]
    assert (line["tenant"], line["calls"], line["deduped"]) == ("a", 2, 1)
    assert (line["input_tokens"], line["output_tokens"]) == (400, 70)
    assert budgets == []  # a has no budget
    assert sum(p["cost"] for p in mine["series"]) == pytest.approx(spent_a)
    # Another tenant's spend, and whether it exists, stay hidden: the same 404 either way.
    assert theirs.status_code == nobody.status_code == 404
    assert theirs.json()["type"] == nobody.json()["type"]
    assert theirs.headers["content-type"] == "application/problem+json"
    assert {x["tenant"] for x in everyone["lines"]} == {"a", "b"}
    (budget,) = everyone["budgets"]
    assert (budget["tenant"], budget["amount"]) == ("b", 0.01)
    assert budget["spent"] == pytest.approx(cost(100, 50)) and budget["held"] == 0
    assert stats["spend"]["cost"] == pytest.approx(spent_a)
    assert stats["spend"]["by_kind"]["chat"]["saved"] == pytest.approx(cost(100, 50))
    assert f'floodway_spend_total{{kind="chat",tenant="a"}} {spent_a}' in metrics
    assert 'floodway_spend_saved_total{kind="chat",tenant="a"}' in metrics


async def test_a_submit_past_the_budget_is_a_402_that_writes_nothing(
    server: tuple[str, Floodway],
) -> None:
    url, fw = server
    async with client(url, "key-b") as b:
        first = await b.post("/v1/tasks", json={"kind": "chat", "input": chat_input(1)})
        second = await b.post("/v1/tasks", json={"kind": "chat", "input": chat_input(2)})
        batch = await b.post(
            "/v1/batches", json={"tasks": [{"kind": "chat", "input": chat_input(3)}]}
        )
        view = (await b.get("/v1/spend")).json()
    assert first.status_code == 202
    assert second.status_code == batch.status_code == 402
    problem = second.json()
    assert second.headers["content-type"] == "application/problem+json"
    assert problem["type"].endswith("budget-exceeded") and problem["title"] == "Payment Required"
    estimate = 0.001 + 1000 * 8.0 / 1e6  # every estimated token at the dearer rate
    assert problem["estimated"] == pytest.approx(estimate)
    # What the first task holds (its estimate) while it runs, what it cost once it ended.
    left = [pytest.approx(0.01 - estimate), pytest.approx(0.01 - cost(100, 50))]
    assert problem["left"] in left
    assert problem["budget"] == 0.01 and problem["tenant"] == "b"
    assert problem["resets_at"].endswith("00:00:00+00:00")
    # what the CLI prints of it: when it resets, and where the budget is set
    assert f"resets at {problem['resets_at']}" in problem["detail"]
    assert "[tenants.b] budget" in problem["detail"]
    assert int(second.headers["retry-after"]) > 0
    assert len(await fw.list_tasks()) == 1
    (budget,) = view["budgets"]
    assert budget["spent"] + budget["held"] + budget["left"] == pytest.approx(0.01)


@pytest.mark.parametrize(
    "params",
    [{"since": "yesterday"}, {"since": "-1h"}, {"bucket": "x"}, {"bucket": "1y"}],
)
async def test_bad_spend_parameters_are_a_422(
    server: tuple[str, Floodway], params: dict[str, str]
) -> None:
    url, _ = server
    async with client(url, "key-a") as a:
        answer = await a.get("/v1/spend", params=params)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"


async def test_the_client_and_the_cli_show_spend_and_a_refusal(
    server: tuple[str, Floodway],
) -> None:
    url, fw = server
    async with client(url, "key-b") as b:
        await run(b, fw, [chat_input(1)])
    async with Client(url, api_key="key-b") as sdk:
        view = await sdk.spend(since="1d")
        with pytest.raises(BudgetExceeded) as refused:
            await sdk.submit("chat", chat_input(2))
    assert view["cost"] == pytest.approx(cost(100, 50))
    assert refused.value.left == pytest.approx(0.01 - cost(100, 50))
    assert refused.value.resets_at % 86400 == 0 and refused.value.retry_after > 0
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "floodway.cli", "spend", "--url", url, "--api-key", "key-b"],
        env={**os.environ, "COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"spend: {cost(100, 50):.2f}" in shown.stdout
    assert "budget of b: 0.01 left of 0.01" in shown.stdout


async def test_a_bucket_too_small_for_its_window_is_widened(server: tuple[str, Floodway]) -> None:
    url, _ = server
    async with client(url, "key-a") as a:
        day = (await a.get("/v1/spend", params={"since": "1d", "bucket": "1ms"})).json()
        none = (await a.get("/v1/spend", params={"since": "0s", "bucket": "0s"})).json()
        ever = (await a.get("/v1/spend", params={"since": "1" * 400, "bucket": "9" * 400})).json()
    assert day["bucket_s"] == pytest.approx(86400 / 10_000)
    assert none["bucket_s"] == 1.0
    assert ever["since"] is not None and ever["bucket_s"] == 100 * 366 * 86400.0
