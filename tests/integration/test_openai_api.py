"""The OpenAI-compatible endpoints, called with the official ``openai`` SDK."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import openai
import pytest

from floodway.core.task import Lane
from floodway.store.base import SpendQuery, TaskQuery
from harness.openai_fake import FakeOpenAI
from tests.integration.conftest import StartApi, eventually
from tests.integration.openai_setup import start_front


async def test_chat_embeddings_and_images_answer_with_the_providers_body(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack)
    client = front.sdk()
    chat = await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello there"}]
    )
    assert chat.choices[0].message.content == "echo: hello there"
    assert chat.usage is not None and chat.usage.total_tokens == 6
    vectors = await client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert [d.index for d in vectors.data] == [0, 1] and len(vectors.data[0].embedding) == 4
    images = await client.images.generate(model="dall-e-3", prompt="a red chair", n=2)
    assert images.data is not None and len(images.data) == 2
    assert [b.endpoint for b in front.fake.billed] == ["chat", "embeddings", "images"]
    listed = await client.models.list()
    assert sorted(m.id for m in listed.data) == [
        "dall-e-3",
        "gpt-4.1-mini",
        "gpt-4o",
        "gpt-4o-mini",
        "text-embedding-3-small",
    ]


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_a_request_retried_with_its_idempotency_key_is_billed_once(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """dedupe = false: only the key joins the two requests (the body alone would not)."""
    front = await start_front(start_api, api_stack, kind_options={"dedupe": False})
    client = front.sdk()
    key = {"Idempotency-Key": "order-17"}
    first = await client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=_ask("once"), extra_headers=key
    )
    again = await client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=_ask("once"), extra_headers=key
    )
    assert first.headers["x-floodway-task"] == again.headers["x-floodway-task"]
    assert first.parse().id == again.parse().id
    assert len(front.fake.billed) == 1
    other = await client.chat.completions.create(model="gpt-4o-mini", messages=_ask("once"))
    assert other.id != first.parse().id and len(front.fake.billed) == 2  # no key: runs anew
    with pytest.raises(openai.ConflictError) as conflict:
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=_ask("another body"), extra_headers=key
        )
    assert conflict.value.code == "idempotency-conflict"


async def test_identical_requests_without_a_key_share_the_work(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack, fake=FakeOpenAI(latency_s=0.3))
    client = front.sdk()
    answers = await asyncio.gather(
        *(client.chat.completions.create(model="gpt-4o", messages=_ask("same")) for _ in range(5))
    )
    assert {a.id for a in answers} == {answers[0].id} and len(front.fake.billed) == 1


async def test_a_provider_429_storm_never_reaches_the_client(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    fake = FakeOpenAI(retry_after_ms=20)
    fake.storm(30)
    front = await start_front(start_api, api_stack, fake=fake)
    client = front.sdk()  # no retries of its own: a 429 that reached it would raise
    answers = await asyncio.gather(
        *(
            client.chat.completions.create(model="gpt-4o-mini", messages=_ask(f"n{i}"))
            for i in range(6)
        )
    )
    assert sorted(a.choices[0].message.content or "" for a in answers) == sorted(
        f"echo: n{i}" for i in range(6)
    )
    assert fake.throttled == 30 and len(fake.billed) == 6


async def test_twenty_concurrent_calls_are_not_refused_past_the_interactive_depth(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """interactive_depth 5: the calls beyond it wait in the background lane."""
    front = await start_front(start_api, api_stack, fake=FakeOpenAI(latency_s=0.2))
    client = front.sdk()
    answers = await asyncio.gather(
        *(
            client.chat.completions.create(model="gpt-4o-mini", messages=_ask(f"c{i}"))
            for i in range(20)
        )
    )
    assert len({a.id for a in answers}) == 20
    tasks = await front.server.fw.list_tasks(TaskQuery(tenant="tenant-a"))
    lanes = [t.lane for t in tasks]
    assert lanes.count(Lane.INTERACTIVE) >= 5 and lanes.count(Lane.BACKGROUND) >= 1


async def test_a_call_that_would_pass_the_clients_deadline_is_a_429_and_goes_on(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack, fake=FakeOpenAI(latency_s=2.5))
    client = front.sdk(timeout=2.0)  # the SDK sends it: X-Stainless-Read-Timeout
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(model="gpt-4o-mini", messages=_ask("slow"))
    assert refused.value.code == "deadline-would-pass"
    assert int(refused.value.response.headers["retry-after"]) >= 1
    assert int(refused.value.response.headers["retry-after-ms"]) >= 1  # which the SDKs prefer
    assert "x-should-retry" not in refused.value.response.headers  # the SDK may ask again
    patient = front.sdk(timeout=30.0)
    answer = await patient.chat.completions.create(model="gpt-4o-mini", messages=_ask("slow"))
    assert answer.choices[0].message.content == "echo: slow"
    assert len(front.fake.billed) == 1  # the second request collected the first one's work
    sdk_retries = front.sdk(timeout=2.0, max_retries=2)  # the SDK's defaults, but the timeout
    answer = await sdk_retries.chat.completions.create(model="gpt-4o-mini", messages=_ask("later"))
    assert answer.choices[0].message.content == "echo: later"  # its retry collected the work
    assert len(front.fake.billed) == 2


async def test_refusals_come_in_openais_error_shape(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack)
    client = front.sdk()
    with pytest.raises(openai.BadRequestError) as streamed:  # only chat streams
        await client.embeddings.create(
            model="text-embedding-3-small", input="x", extra_body={"stream": True}
        )
    assert streamed.value.code == "stream-unsupported" and streamed.value.param == "stream"
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.chat.completions.create(model="gpt-5-nano", messages=_ask("x"))
    assert unknown.value.code == "model-not-found" and "gpt-4o-mini" in unknown.value.message
    with pytest.raises(openai.AuthenticationError):
        await front.sdk(key="nobody").models.list()
    with pytest.raises(openai.BadRequestError) as refused:  # the provider's own 400, retold
        await client.chat.completions.create(model="gpt-4o", messages=_ask("refuse this"))
    assert refused.value.code == "content_policy_violation"
    assert (
        refused.value.message == "Error code: 400 - Your request was rejected by the safety system"
    )
    assert refused.value.response.headers["x-floodway-task"].startswith("t_")
    http = await front.server.client("key-a")
    raw = await http.post(
        "/openai/v1/embeddings", content=b"{", headers={"content-type": "application/json"}
    )
    assert raw.status_code == 400
    assert raw.headers["content-type"] == "application/problem+json"
    assert raw.json()["error"]["type"] == "invalid_request_error"
    assert front.fake.billed == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", b'{"model": "gpt-4o", "messages": [], "max_tokens": 1e30}'),
        (
            "/chat/completions",
            b'{"model": "gpt-4o", "messages": [], "max_tokens": 1' + b"0" * 30 + b"}",
        ),
        ("/chat/completions", b'{"model": "gpt-4o", "messages": [], "max_completion_tokens": -1}'),
        ("/images/generations", b'{"model": "dall-e-3", "prompt": "x", "n": 1e30}'),
    ],
)
async def test_a_count_out_of_range_is_refused_before_anything_runs(
    start_api: StartApi, api_stack: AsyncExitStack, path: str, body: bytes
) -> None:
    """max_tokens = 1e30 was accepted and run: a count is a whole number within 32 bits."""
    front = await start_front(start_api, api_stack)
    http = await front.server.client("key-a")
    answer = await http.post(
        "/openai/v1" + path, content=body, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    error = answer.json()["error"]
    assert "whole number from 0 to" in error["message"] and error["type"] == "invalid_request_error"
    assert await front.server.fw.list_tasks() == [] and front.fake.billed == []


BAD_REQUESTS = [
    ("POST", "/openai/v1/chat/completions", {"messages": []}),
    ("POST", "/openai/v1/chat/completions", {"model": 5, "messages": []}),
    ("POST", "/openai/v1/chat/completions", {"model": "gpt-4o", "messages": "not a list"}),
    ("POST", "/openai/v1/chat/completions", {"model": "gpt-4o", "max_tokens": "many"}),
    ("POST", "/openai/v1/chat/completions", ["not", "an", "object"]),
    ("POST", "/openai/v1/chat/completions", b'{"model": "gpt-4o", "messages": [], "x": "\\ud800"}'),
    ("POST", "/openai/v1/embeddings", {"model": "text-embedding-3-small", "input": {"x": 1}}),
    ("POST", "/openai/v1/images/generations", {"model": "dall-e-3", "n": "two"}),
    ("POST", "/openai/v1/batches", {}),
    ("POST", "/openai/v1/batches", {"endpoint": "/v1/chat/completions", "completion_window": "1h"}),
    (
        "POST",
        "/openai/v1/batches",
        {"endpoint": "/v1/embeddings", "completion_window": "24h", "input_file_id": "file_\x00"},
    ),
    (
        "POST",
        "/openai/v1/batches",
        {
            "endpoint": "/v1/embeddings",
            "completion_window": "24h",
            "input_file_id": "f",
            "metadata": {"k": 1},
        },
    ),
    ("POST", "/openai/v1/files", None),
    ("GET", "/openai/v1/files/%00", None),
    ("GET", "/openai/v1/files/file_nope/content", None),
    ("GET", "/openai/v1/batches/batch_nope", None),
    ("GET", "/openai/v1/batches?after=%00", None),
    ("GET", "/openai/v1/batches?limit=0", None),
    ("POST", "/openai/v1/batches/batch_nope/cancel", None),
    ("GET", "/openai/v1/models/nope", None),
]


@pytest.mark.parametrize(("method", "path", "body"), BAD_REQUESTS)
async def test_bad_requests_are_4xx_problems_with_openais_error(
    start_api: StartApi, api_stack: AsyncExitStack, method: str, path: str, body: object
) -> None:
    front = await start_front(start_api, api_stack)
    http = await front.server.client("key-a")
    if isinstance(body, bytes):  # what a JSON encoder would not write
        json_type = {"content-type": "application/json"}
        answer = await http.request(method, path, content=body, headers=json_type)
    else:
        answer = await http.request(method, path, json=body)
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    error = answer.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"


async def test_a_call_cancelled_through_floodway_answers_409_task_cancelled(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack, fake=FakeOpenAI(latency_s=5.0))
    client = front.sdk()
    call = asyncio.ensure_future(
        client.chat.completions.create(model="gpt-4o", messages=_ask("long"))
    )
    fw = front.server.fw
    running: list[str] = []

    async def started() -> bool:
        running[:] = [t.id for t in await fw.list_tasks(TaskQuery(tenant="tenant-a"))]
        return bool(running) and front.fake.in_flight == 1

    await eventually(started)
    http = await front.server.client("key-a")
    assert (await http.delete(f"/v1/tasks/{running[0]}")).status_code == 200
    with pytest.raises(openai.ConflictError) as cancelled:
        await call
    assert cancelled.value.code == "task-cancelled"
    assert cancelled.value.response.headers["x-floodway-task"] == running[0]


async def test_a_tenants_budget_holds_on_the_openai_front(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """The SDK's calls and its Batch API go through the same budget check as /v1/tasks: a
    call past what is left is a 402 in OpenAI's error shape, a batch past it is refused whole."""
    front = await start_front(
        start_api,
        api_stack,
        kind_options={"price": {"per_request": 1.0}},
        tenants={"tenant-a": {"budget": {"amount": 2.5}}},
    )
    client = front.sdk()
    for text in ("one", "two"):
        await client.chat.completions.create(model="gpt-4o-mini", messages=_ask(text))
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(model="gpt-4o-mini", messages=_ask("three"))
    assert refused.value.status_code == 402 and refused.value.code == "budget-exceeded"
    line = {
        "custom_id": "req-0",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": _ask("four")},
    }
    uploaded = await client.files.create(
        file=("one.jsonl", (json.dumps(line) + "\n").encode()), purpose="batch"
    )
    with pytest.raises(openai.APIStatusError) as batch_refused:
        await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert batch_refused.value.status_code == 402
    assert len(front.fake.billed) == 2
    other = front.sdk(key="key-b")  # another tenant has no budget
    await other.chat.completions.create(model="gpt-4o-mini", messages=_ask("three"))
    assert len(front.fake.billed) == 3


async def test_a_budget_admits_only_what_fits_at_the_worst_case(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """A request is estimated at its worst case: n answers of its max_tokens, and with no
    max_tokens its model's longest answer (gpt-4o-mini: 16,384 tokens), so a model that
    writes all it may cannot take a tenant past its budget, whichever way the request came
    in. (Counted once and at 256 tokens, 5 requests with n = 100 spent 5.00 of 1.50.)"""
    fake = FakeOpenAI(longest=16_384)
    front = await start_front(
        start_api,
        api_stack,
        fake=fake,
        kind_options={"price": {"output_per_1m": 10.0}},
        tenants={"tenant-a": {"budget": {"amount": 1.5}}, "tenant-b": {"budget": {"amount": 0.5}}},
    )
    answers: list[int] = []
    for i in range(5):
        try:
            await front.sdk().chat.completions.create(
                model="gpt-4o-mini", messages=_ask(f"q{i}"), n=100, max_tokens=1000
            )
            answers.append(200)
        except openai.APIStatusError as exc:
            answers.append(exc.status_code)
    http = await front.server.client("key-a")
    body = {"model": "gpt-4o-mini", "messages": _ask("again"), "n": 100, "max_tokens": 1000}
    task = await http.post("/v1/tasks", json={"kind": "chat", "input": body})
    assert (answers, task.status_code) == ([200, 402, 402, 402, 402], 402), task.text
    for i in range(5):
        try:
            await front.sdk(key="key-b").chat.completions.create(
                model="gpt-4o-mini", messages=_ask(f"q{i}")
            )
            answers.append(200)
        except openai.APIStatusError as exc:
            answers.append(exc.status_code)
    assert answers[5:] == [200, 200, 200, 402, 402]
    report = await front.server.fw.spend(SpendQuery(since=0.0))
    spent = {line.tenant: (line.cost, line.calls, line.over_estimate) for line in report.lines}
    assert spent == {
        "tenant-a": (pytest.approx(1.0), 1, 0.0),
        "tenant-b": (pytest.approx(3 * 16_384 * 10.0 / 1e6), 3, 0.0),
    }
    assert len(fake.billed) == 4


async def test_a_refused_call_spends_no_submit_rate_token(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """Every way in checks the request before it takes the tenant's token (the OpenAI calls
    took it first, so a bad request left the tenant one submit short)."""
    front = await start_front(start_api, api_stack, tenants={"submit_rate": "1/m"})
    http = await front.server.client("key-a")
    nan = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "n": NaN}'
    bad = await http.post(
        "/openai/v1/chat/completions", content=nan, headers={"content-type": "application/json"}
    )
    assert bad.status_code == 422, bad.text
    good = await front.sdk().chat.completions.create(model="gpt-4o", messages=_ask("hi"))
    assert good.choices
