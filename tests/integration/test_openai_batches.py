"""The Batch API through the official ``openai`` SDK: upload, create, poll, download, cancel,
on SQLite and PostgreSQL, and what another tenant cannot see."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import openai
import psycopg
import pytest
from openai.types import Batch

from floodway.config import ResourceConfig
from harness.fleet import PG_URL, fresh_database
from harness.openai_fake import FakeOpenAI
from tests.integration.conftest import StartApi, eventually
from tests.integration.openai_setup import OpenAIFront, start_front


# Asked for before ``start_api`` in each test: set up first, so torn down last (a database
# dropped under a running server makes its shutdown wait out the pool's timeout).
@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    if request.param == "sqlite":
        yield None  # start_api's own SQLite file
        return
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {PG_URL} is unavailable: {exc}")
    async with fresh_database() as url:
        yield url


def _jsonl(texts: list[str]) -> bytes:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]},
        }
        for i, text in enumerate(texts)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def _until_ended(client: openai.AsyncOpenAI, batch_id: str) -> Batch:
    ended: list[Batch] = []

    async def check() -> bool:
        batch = await client.batches.retrieve(batch_id)
        ended[:] = [batch]
        return batch.status in ("completed", "cancelled")

    await eventually(check, timeout=60)
    return ended[0]


async def _lines(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [json.loads(line) for line in content.text.splitlines()]


async def _front(
    start_api: StartApi, stack: AsyncExitStack, database: str | None, latency_s: float
) -> OpenAIFront:
    fake = FakeOpenAI(latency_s=latency_s)
    return await start_front(start_api, stack, fake=fake, database=database)


async def test_a_batch_of_200_is_answered_once_per_custom_id(
    database: str | None, start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await _front(start_api, api_stack, database, latency_s=0.01)
    client = front.sdk()
    texts = [f"refuse {i}" if i % 40 == 7 else f"image {i}" for i in range(200)]
    uploaded = await client.files.create(file=("images.jsonl", _jsonl(texts)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    batch = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"story": "200 images"},
    )
    assert batch.status == "in_progress" and batch.request_counts is not None
    assert batch.request_counts.total == 200
    ended = await _until_ended(client, batch.id)
    assert ended.status == "completed" and ended.metadata == {"story": "200 images"}
    assert ended.request_counts is not None
    assert (ended.request_counts.completed, ended.request_counts.failed) == (195, 5)
    output = await _lines(client, ended.output_file_id)
    errors = await _lines(client, ended.error_file_id)
    answered = [line["custom_id"] for line in output + errors]
    assert sorted(answered) == sorted(f"req-{i}" for i in range(200))  # each exactly once
    for line in output:
        i = int(line["custom_id"].removeprefix("req-"))
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"][0]["message"]["content"] == f"echo: image {i}"
    for line in errors:
        assert line["response"]["status_code"] == 400
        assert line["response"]["body"]["error"]["code"] == "content_policy_violation"
    assert len(front.fake.billed) == 195  # refusals are not billed, nothing twice
    again = await client.batches.retrieve(batch.id)  # ended once: the same files
    assert (again.output_file_id, again.error_file_id) == (
        ended.output_file_id,
        ended.error_file_id,
    )
    listed = await client.batches.list(limit=10)
    assert [b.id for b in listed.data] == [batch.id]


async def test_a_cancelled_batch_ends_with_every_request_accounted_for(
    database: str | None, start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await _front(start_api, api_stack, database, latency_s=0.3)
    client = front.sdk()
    uploaded = await client.files.create(
        file=("many.jsonl", _jsonl([f"n{i}" for i in range(60)])), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    ended = await _until_ended(client, batch.id)
    assert ended.status == "cancelled" and ended.cancelled_at is not None
    counts = ended.request_counts
    assert counts is not None and counts.completed + counts.failed == 60 and counts.failed > 0
    output = await _lines(client, ended.output_file_id)
    errors = await _lines(client, ended.error_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(
        f"req-{i}" for i in range(60)
    )
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert len(front.fake.billed) < 60


async def test_a_batch_cancelled_mid_run_keeps_the_cap_and_answers_what_was_billed(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """``floodway serve`` on SQLite, a resource capped at 10: 100 lines, cancelled once 20 are
    answered. No queued line reaches the provider after the cancel, the provider never runs
    more than 10, the lines running at the cancel are read to their end, and every line the
    provider billed is in the output file (none in the error file as ``batch_cancelled``)."""
    fake = FakeOpenAI(latency_s=0.3)
    front = await start_front(
        start_api,
        api_stack,
        fake=fake,
        resources={"openai": ResourceConfig(concurrency=10)},
        kind_options={"resource": "openai"},
    )
    client = front.sdk()
    uploaded = await client.files.create(
        file=("many.jsonl", _jsonl([f"n{i}" for i in range(100)])), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    async def twenty_billed() -> bool:
        return len(fake.billed) >= 20

    await eventually(twenty_billed, timeout=30)
    await client.batches.cancel(batch.id)
    ended = await _until_ended(client, batch.id)
    assert ended.status == "cancelled"
    output = await _lines(client, ended.output_file_id)
    errors = await _lines(client, ended.error_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(
        f"req-{i}" for i in range(100)
    )
    assert fake.peak_in_flight <= 10
    assert len(fake.billed) < 40  # what ran or was running at the cancel, no more
    billed = Counter(bill.key for bill in fake.billed)
    assert max(billed.values()) == 1
    fw = front.server.fw
    answered = {(await fw.get(line["response"]["request_id"])).work_key for line in output}
    assert answered == set(billed)  # each billed line answered, each answered line billed
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}


async def test_another_tenants_files_and_batches_do_not_exist_for_it(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await _front(start_api, api_stack, None, latency_s=0.0)
    mine, theirs = front.sdk("key-a"), front.sdk("key-b")
    uploaded = await mine.files.create(file=("a.jsonl", _jsonl(["x"])), purpose="batch")
    batch = await mine.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with pytest.raises(openai.NotFoundError):
        await theirs.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        await theirs.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        await theirs.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        await theirs.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):  # nor can it start a batch on my file
        await theirs.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert (await theirs.batches.list()).data == []


async def test_bad_uploads_and_batches_are_refused_with_what_is_wrong(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await _front(start_api, api_stack, None, latency_s=0.0)
    client = front.sdk()
    with pytest.raises(openai.BadRequestError) as not_json:
        await client.files.create(file=("x.jsonl", b'{"custom_id": "a"}\nnope\n'), purpose="batch")
    assert "line 2" in not_json.value.message
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        line = b'{"custom_id": "a", "body": {"temperature": ' + constant + b"}}\n"
        with pytest.raises(openai.BadRequestError) as nan:
            await client.files.create(file=("x.jsonl", line), purpose="batch")
        assert "line 1 holds" in nan.value.message and constant.decode() in nan.value.message
    assert (await client.files.list()).data == []  # nothing was stored
    deep = b'{"custom_id": "a", "body": ' + b"[" * 5000 + b"]" * 5000 + b"}\n"
    with pytest.raises(openai.BadRequestError) as too_deep:
        await client.files.create(file=("x.jsonl", deep), purpose="batch")
    assert "line 1 nests deeper" in too_deep.value.message
    with pytest.raises(openai.BadRequestError) as purpose:
        await client.files.create(file=("x.jsonl", _jsonl(["x"])), purpose="fine-tune")
    assert purpose.value.param == "purpose"
    wrong_model = _jsonl(["x"]).replace(b"gpt-4o-mini", b"gpt-9")
    uploaded = await client.files.create(file=("x.jsonl", wrong_model), purpose="batch")
    with pytest.raises(openai.BadRequestError) as model:
        await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert "line 1" in model.value.message and "gpt-9" in model.value.message
    with pytest.raises(openai.BadRequestError) as endpoint:
        await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
        )
    assert "line 1" in endpoint.value.message
    assert await front.server.fw.list_tasks() == []  # nothing of a refused batch was queued


async def test_an_upload_over_max_file_bytes_is_a_413_naming_the_setting(
    start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await start_front(start_api, api_stack, api={"max_file_bytes": 4096})
    client = front.sdk()
    small = await client.files.create(file=("s.jsonl", _jsonl(["x"] * 10)), purpose="batch")
    assert small.bytes > 1024
    with pytest.raises(openai.APIStatusError) as big:
        await client.files.create(file=("b.jsonl", _jsonl(["x"] * 100)), purpose="batch")
    assert big.value.status_code == 413 and "max_file_bytes" in big.value.message


async def test_batches_list_newest_first_a_page_at_a_time_and_files_can_be_deleted(
    database: str | None, start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    front = await _front(start_api, api_stack, database, latency_s=0.0)
    client = front.sdk()
    uploaded = await client.files.create(file=("a.jsonl", _jsonl(["x"])), purpose="batch")
    made = [
        (
            await client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        ).id
        for _ in range(3)
    ]
    first = await client.batches.list(limit=2)
    assert [b.id for b in first.data] == made[:0:-1] and first.has_more
    rest = await client.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in rest.data] == made[:1] and not rest.has_more
    files = await client.files.list(purpose="batch")
    assert [f.id for f in files.data] == [uploaded.id]
    outputs = await client.files.list(purpose="batch_output")  # maintenance's, of ended batches
    assert {f.purpose for f in outputs.data} <= {"batch_output"}
    raw = (  # a NUL in the file name, which no SDK would send (PostgreSQL text cannot hold it)
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="n\x00ul.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n" + _jsonl(["x"]) + b"\r\n--b--\r\n"
    )
    http = await front.server.client("key-a")
    named = await http.post(
        "/openai/v1/files", content=raw, headers={"content-type": "multipart/form-data; boundary=b"}
    )
    assert named.status_code == 200 and named.json()["filename"] == "nul.jsonl"
    deleted = await client.files.delete(uploaded.id)
    assert deleted.deleted and deleted.id == uploaded.id
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(uploaded.id)
    ended = await _until_ended(client, made[0])  # its tasks hold their requests
    assert ended.status == "completed" and ended.request_counts is not None
    assert ended.request_counts.completed == 1


async def test_maintenance_ends_a_batch_that_nobody_reads(
    database: str | None, start_api: StartApi, api_stack: AsyncExitStack
) -> None:
    """Its files are written while the results are there, not at a read days later."""
    front = await _front(start_api, api_stack, database, latency_s=0.0)
    client = front.sdk()
    uploaded = await client.files.create(
        file=("a.jsonl", _jsonl(["a", "refuse b"])), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    store = front.server.fw.store

    async def ended() -> bool:  # read from the ledger, not through the API
        row = await store.get_openai_batch(batch.id, "tenant-a")
        return row is not None and row.status == "completed"

    await eventually(ended)
    row = await store.get_openai_batch(batch.id, "tenant-a")
    assert row is not None and row.output_file_id and row.error_file_id
    output = await store.file_content(row.output_file_id, "tenant-a")
    assert output is not None and b'"custom_id":"req-0"' in output
