"""``floodway simulate --anthropic``'s app over HTTP: Anthropic's refusals, and its Message
Batches held for their hold time on the simulator's clock, each request answered once at the
batch price, a cancel keeping what was answered (billed) and the rest ``canceled``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from floodway.providers.sim import SimulatorConfig
from floodway.providers.sim.anthropic import create_anthropic_simulator_app
from floodway.serving import serve_app
from floodway.testing import FakeClock

HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
HOLD_S = 100.0


@pytest.fixture
async def api(clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    app = create_anthropic_simulator_app(
        SimulatorConfig(latency_ms=0, batch_hold_s=HOLD_S), clock.now
    )
    async with serve_app(app) as url, httpx.AsyncClient(base_url=url, headers=HEADERS) as http:
        yield http


def request(i: int, **params: Any) -> dict[str, Any]:
    body = {"model": "claude-haiku-4-5", "max_tokens": 32,
            "messages": [{"role": "user", "content": f"line {i}"}], **params}  # fmt: skip
    return {"custom_id": f"t_{i}", "params": body}


def results(answer: httpx.Response) -> dict[str, dict[str, Any]]:
    lines = [json.loads(line) for line in answer.text.splitlines() if line.strip()]
    return {line["custom_id"]: line["result"] for line in lines}


async def test_a_call_without_its_key_or_version_or_max_tokens_is_refused_as_anthropic_does(
    api: httpx.AsyncClient,
) -> None:
    ask = request(0)["params"]
    no_key = await api.post("/v1/messages", json=ask, headers={"x-api-key": ""})
    assert no_key.status_code == 401
    refusal = {"type": "authentication_error", "message": "x-api-key header is required"}
    assert no_key.json() == {"type": "error", "error": refusal}
    no_version = await api.post("/v1/messages", json=ask, headers={"anthropic-version": ""})
    assert no_version.status_code == 400
    unbounded = await api.post("/v1/messages", json={**ask, "max_tokens": None})
    assert unbounded.json()["error"]["type"] == "invalid_request_error"
    ledger = (await api.get("/ledger")).json()
    assert ledger["sync"] == {"calls": 0, "input_tokens": 0, "output_tokens": 0}


async def test_a_batch_is_held_then_answers_each_request_once_and_bills_the_valid_ones(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    requests = [request(0), request(1), request(2, max_tokens=0)]
    created = (await api.post("/v1/messages/batches", json={"requests": requests})).json()
    assert created["processing_status"] == "in_progress" and created["results_url"] is None
    assert created["request_counts"]["processing"] == 3
    early = await api.get(f"/v1/messages/batches/{created['id']}/results")
    assert early.status_code == 400
    await clock.jump(HOLD_S)
    ended = (await api.get(f"/v1/messages/batches/{created['id']}")).json()
    assert ended["processing_status"] == "ended" and ended["cancel_initiated_at"] is None
    assert ended["request_counts"] == {"processing": 0, "succeeded": 2, "errored": 1,
                                       "canceled": 0, "expired": 0}  # fmt: skip
    answered = results(await api.get(ended["results_url"]))
    assert answered["t_0"]["message"]["content"][0]["text"] == "echo: line 0"
    assert answered["t_2"]["type"] == "errored"
    assert answered["t_2"]["error"]["error"]["type"] == "invalid_request_error"
    ledger = (await api.get("/ledger")).json()["batch"]
    assert (ledger["batches"], ledger["lines"], ledger["custom_ids"]) == (1, 2, ["t_0", "t_1"])


async def test_a_batch_cancelled_halfway_keeps_what_it_answered_and_cancels_the_rest(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    created = (
        await api.post("/v1/messages/batches", json={"requests": [request(i) for i in range(10)]})
    ).json()
    await clock.jump(HOLD_S / 2)
    canceling = (await api.post(f"/v1/messages/batches/{created['id']}/cancel")).json()
    assert canceling["processing_status"] == "canceling" and canceling["cancel_initiated_at"]
    await clock.jump(1)
    cancelled = (await api.get(f"/v1/messages/batches/{created['id']}")).json()
    assert cancelled["processing_status"] == "ended"
    assert cancelled["request_counts"]["succeeded"] == 5
    assert cancelled["request_counts"]["canceled"] == 5
    kinds = [r["type"] for r in results(await api.get(cancelled["results_url"])).values()]
    assert sorted(kinds) == ["canceled"] * 5 + ["succeeded"] * 5
    assert (await api.get("/ledger")).json()["batch"]["lines"] == 5


async def test_batches_are_listed_newest_first_a_page_after_another(
    api: httpx.AsyncClient,
) -> None:
    made = [
        (await api.post("/v1/messages/batches", json={"requests": [request(i)]})).json()["id"]
        for i in range(3)
    ]
    first = (await api.get("/v1/messages/batches", params={"limit": 2})).json()
    assert [b["id"] for b in first["data"]] == made[::-1][:2] and first["has_more"]
    rest = (
        await api.get("/v1/messages/batches", params={"limit": 2, "after_id": first["last_id"]})
    ).json()
    assert [b["id"] for b in rest["data"]] == [made[0]] and not rest["has_more"]


async def test_a_batch_with_a_bad_or_repeated_custom_id_is_refused_and_not_made(
    api: httpx.AsyncClient,
) -> None:
    bad = {**request(0), "custom_id": "not ok!"}
    for requests in ([bad], [request(0), request(0)], []):
        answer = await api.post("/v1/messages/batches", json={"requests": requests})
        assert answer.status_code == 400
        assert answer.json()["error"]["type"] == "invalid_request_error"
    assert (await api.get("/ledger")).json()["batch"]["batches"] == 0
