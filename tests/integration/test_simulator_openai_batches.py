"""The simulator's Files and Batch API through the official SDK: a batch is held for its hold
time on the simulator's clock, answers each line once at the batch price, and a cancel keeps
the lines answered so far (billed) and drops the rest (not billed)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from floodway.providers.sim import SimulatorConfig
from floodway.providers.sim.openai import create_openai_simulator_app
from floodway.serving import serve_app


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def jsonl(n: int, fail: dict[int, str] | None = None) -> bytes:
    lines = []
    for i in range(n):
        body: dict[str, object] = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": f"line {i}"}],
        }
        if fail and i in fail:
            body["metadata"] = {"fail": fail[i]}
        lines.append({"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": body})  # fmt: skip
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, openai.AsyncOpenAI, Clock]]:
    clock = Clock()
    app = create_openai_simulator_app(SimulatorConfig(latency_ms=0, batch_hold_s=900), clock)
    async with serve_app(app) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", max_retries=0)
        try:
            yield url, client, clock
        finally:
            await client.close()


async def _ledger(url: str) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=url) as http:
        batch: dict[str, object] = (await http.get("/ledger")).json()["batch"]
        return batch


async def test_a_batch_is_held_then_answers_every_line_once_at_the_batch_price(
    served: tuple[str, openai.AsyncOpenAI, Clock],
) -> None:
    url, client, clock = served
    file = await client.files.create(file=("in.jsonl", jsonl(4, {3: "5xx"})), purpose="batch")
    batch = await client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"floodway_batch": "ub-1"},
    )
    assert batch.status == "in_progress"
    clock.now += 899
    assert (await client.batches.retrieve(batch.id)).status == "in_progress"
    clock.now += 1
    done = await client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    assert done.output_file_id is not None and done.error_file_id is not None
    out = (await client.files.content(done.output_file_id)).text.splitlines()
    answered = {json.loads(line)["custom_id"]: json.loads(line)["response"] for line in out}
    assert sorted(answered) == ["t0", "t1", "t2"]
    assert answered["t0"]["body"]["choices"][0]["message"]["content"] == "echo: line 0"
    errors = (await client.files.content(done.error_file_id)).text.splitlines()
    assert [json.loads(e)["response"]["status_code"] for e in errors] == [500]
    listed = [b async for b in client.batches.list()]
    assert [(b.id, b.metadata) for b in listed] == [(batch.id, {"floodway_batch": "ub-1"})]
    ledger = await _ledger(url)
    assert ledger["lines"] == 3 and ledger["batches"] == 1 and ledger["discount"] == 0.5
    assert ledger["double_charged"] == []


async def test_a_cancelled_batch_keeps_the_lines_it_answered_and_bills_only_those(
    served: tuple[str, openai.AsyncOpenAI, Clock],
) -> None:
    url, client, clock = served
    file = await client.files.create(file=("in.jsonl", jsonl(10)), purpose="batch")
    batch = await client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    clock.now += 450  # half the hold
    cancelled = await client.batches.cancel(batch.id)
    assert cancelled.status == "cancelled" and cancelled.output_file_id is not None
    out = (await client.files.content(cancelled.output_file_id)).text.splitlines()
    assert [json.loads(line)["custom_id"] for line in out] == ["t0", "t1", "t2", "t3", "t4"]
    assert (await _ledger(url))["lines"] == 5


async def test_bad_batches_are_refused_naming_the_field(
    served: tuple[str, openai.AsyncOpenAI, Clock],
) -> None:
    _, client, _ = served
    with pytest.raises(openai.BadRequestError, match="input_file_id"):
        await client.batches.create(
            input_file_id="file-none", endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.NotFoundError):
        await client.batches.retrieve("batch_none")
