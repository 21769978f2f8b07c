"""The OpenAI-compatible front on a split deployment, as processes: `floodway api` (no
workers) and `floodway worker` on one PostgreSQL ledger, the official SDK as the client. The
waiting request sees a task another process ran; the batch is ended by the worker's
maintenance."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import openai
import psycopg
import pytest

from floodway.providers.sim import SimulatorConfig
from floodway.providers.sim.openai import create_openai_simulator_app
from floodway.serving import serve_app
from harness.fleet import PG_URL, fresh_database
from harness.openai_fake import FakeOpenAI
from harness.processes import ROOT, until, until_healthy
from tests.acceptance.clirun import free_port

pytestmark = pytest.mark.slow


@asynccontextmanager
async def process(*args: str, log: Path) -> AsyncIterator[None]:
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "floodway.cli", *args, cwd=ROOT, stdout=out, stderr=out
        )
        try:
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)


async def test_the_sdk_through_floodway_api_and_a_worker_process(tmp_path: Path) -> None:
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {PG_URL} is unavailable: {exc}")
    fake = FakeOpenAI(latency_s=0.05)
    fake.storm(5)
    async with AsyncExitStack() as stack:
        database = await stack.enter_async_context(fresh_database())
        upstream = await stack.enter_async_context(serve_app(fake.app()))
        config = tmp_path / "floodway.toml"
        config.write_text(f"""
database = "{database}"
[api]
keys = {{ "key-a" = "tenant-a" }}
[resources.openai]
concurrency = 4
[kinds.chat]
adapter = "openai"
resource = "openai"
base_url = "{upstream}/v1"
models = ["gpt-4o-mini"]
""")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        api_log, worker_log = tmp_path / "api.log", tmp_path / "worker.log"
        await stack.enter_async_context(
            process("api", "--config", str(config), "--port", str(port), log=api_log)
        )
        await stack.enter_async_context(process("worker", "--config", str(config), log=worker_log))
        await until_healthy(url, 30, "floodway api")
        client = openai.AsyncOpenAI(base_url=f"{url}/openai/v1", api_key="key-a", max_retries=0)
        stack.push_async_callback(client.close)
        chat = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "across processes"}]
        )
        assert chat.choices[0].message.content == "echo: across processes"
        lines = [
            {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"{i}"}]}}
            for i in range(20)
        ]  # fmt: skip
        content = "".join(json.dumps(line) + "\n" for line in lines).encode()
        uploaded = await client.files.create(file=("b.jsonl", content), purpose="batch")
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:

            async def ended_by_maintenance() -> bool:  # read the ledger, not the API
                cur = await conn.execute(
                    "SELECT status FROM openai_batches WHERE id = %s", (batch.id,)
                )
                row = await cur.fetchone()
                return row is not None and row[0] == "completed"

            await until(ended_by_maintenance, 30, "the worker's maintenance ends the batch")
        ended = await client.batches.retrieve(batch.id)
        assert ended.output_file_id is not None and ended.error_file_id is None
        output = (await client.files.content(ended.output_file_id)).text.splitlines()
        assert sorted(json.loads(line)["custom_id"] for line in output) == sorted(
            f"c{i}" for i in range(20)
        )
        assert fake.throttled == 5 and len(fake.billed) == 21 and fake.peak_in_flight <= 4


async def test_streams_and_background_responses_across_an_api_and_a_worker_process(
    tmp_path: Path,
) -> None:
    """The worker reads the provider's stream into the ledger; the API process, which runs no
    handler, streams it to the client from there (its change feed wakes it)."""
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {PG_URL} is unavailable: {exc}")
    simulator = create_openai_simulator_app(SimulatorConfig(latency_ms=20, chunk_ms=20))
    async with AsyncExitStack() as stack:
        database = await stack.enter_async_context(fresh_database())
        upstream = await stack.enter_async_context(serve_app(simulator))
        config = tmp_path / "floodway.toml"
        config.write_text(f"""
database = "{database}"
[api]
keys = {{ "key-a" = "tenant-a" }}
[kinds.chat]
adapter = "openai"
base_url = "{upstream}/v1"
models = ["gpt-4o-mini"]
[kinds.respond]
adapter = "openai"
endpoint = "responses"
base_url = "{upstream}/v1"
models = ["gpt-4.1-mini"]
""")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        await stack.enter_async_context(
            process("api", "--config", str(config), "--port", str(port), log=tmp_path / "a.log")
        )
        await stack.enter_async_context(
            process("worker", "--config", str(config), log=tmp_path / "w.log")
        )
        await until_healthy(url, 30, "floodway api")
        client = openai.AsyncOpenAI(base_url=f"{url}/openai/v1", api_key="key-a", max_retries=0)
        stack.push_async_callback(client.close)
        words = "one two three four five six seven eight"
        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": words}], stream=True
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == f"echo: {words}" and len(chunks) > 8  # arrived a chunk at a time
        queued = await client.responses.create(model="gpt-4.1-mini", input=words, background=True)
        resumed = await client.responses.retrieve(queued.id, stream=True, starting_after=2)
        events = [e async for e in resumed]
        assert events[0].sequence_number == 3 and events[-1].type == "response.completed"
        assert simulator.state.simulator.core.ledger.total == 2
