"""``floodway serve`` SIGKILLed with its batch-tier tasks in a provider batch: right after the
batch was created upstream, and while it is in progress. After the restart no second provider
batch holds those tasks, every task is answered, and no line is billed twice (the provider is
``floodway simulate --openai`` or ``--anthropic``, whose batch API keeps its own charge
ledger; an Anthropic batch has no tag, and is found by its size and time)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.processes import spawn_floodway, until, until_healthy
from tests.acceptance.clirun import free_port

pytestmark = pytest.mark.slow

TASKS = 30
CONFIG = """\
database = "sqlite:///{folder}/floodway.db"
[api]
keys = {{ "key-a" = "tenant-a" }}
[worker]
lease = "2s"
[kinds.chat]
tiers = ["sync", "batch"]
batch_max_age = "1s"
price = {{ input_per_1m = 0.15, output_per_1m = 0.6 }}
"""
#: each provider's kind, and the text of an answer
PROVIDERS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "openai": (
        'adapter = "openai"\nmodel = "gpt-4o-mini"\nbase_url = "{provider}/v1"\n',
        lambda result: result["choices"][0]["message"]["content"],
    ),
    "anthropic": (
        'adapter = "anthropic"\nmodel = "claude-haiku-4-5"\nmax_output_tokens = 64\n'
        'api_key_env = "FW_TEST_ANTHROPIC_KEY"\nbase_url = "{provider}"\n',
        lambda result: result["content"][0]["text"],
    ),
}
ENV = {"FW_TEST_ANTHROPIC_KEY": "sk-ant-test"}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("provider_name", sorted(PROVIDERS))
@pytest.mark.parametrize("when", ["created", "in_progress"])
async def test_a_sigkill_around_a_provider_batch_makes_no_second_batch_and_bills_once(
    tmp_path: Path, when: str, provider_name: str
) -> None:
    sim_port, port = free_port(), free_port()
    provider, url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{port}"
    sim = spawn_floodway(
        ["simulate", f"--{provider_name}", "--port", str(sim_port), "--latency-ms", "0",
         "--batch-hold-ms", "4000"], {}, tmp_path / "sim.log",
    )  # fmt: skip
    kind, text_of = PROVIDERS[provider_name]
    config = tmp_path / "floodway.toml"
    config.write_text(CONFIG.format(folder=tmp_path) + kind.format(provider=provider))
    serve_args = ["serve", "--config", str(config), "--port", str(port)]
    served = spawn_floodway(serve_args, ENV, tmp_path / "serve-1.log")
    headers = {"Authorization": "Bearer key-a"}
    try:
        async with (
            httpx.AsyncClient(base_url=provider) as sim_http,
            httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as api,
        ):

            async def batches() -> dict[str, Any]:
                try:
                    ledger: dict[str, Any] = (await sim_http.get("/ledger")).json()["batch"]
                except httpx.HTTPError:
                    return {"batches": 0}
                return ledger

            async def created() -> bool:
                return int((await batches())["batches"]) >= 1

            await until_healthy(url, 30, "floodway serve")
            body = {"tasks": [
                {"kind": "chat", "deadline_s": 43200, "tier": "batch",
                 "input": {"messages": [{"role": "user", "content": f"product {i}"}]}}
                for i in range(TASKS)
            ]}  # fmt: skip
            submitted = await api.post("/v1/batches", json=body)
            assert submitted.status_code == 202, submitted.text
            ids = submitted.json()["task_ids"]
            await until(created, 30, "the provider batch is created")
            if when == "in_progress":
                await until(lambda: _recorded(tmp_path), 10, "the batch's provider id recorded")
            os.kill(served.pid, signal.SIGKILL)
            served.wait()
            served = spawn_floodway(serve_args, ENV, tmp_path / "serve-2.log")
            await until_healthy(url, 30, "floodway serve, restarted")

            async def all_done() -> bool:
                for task_id in ids:
                    task = (await api.get(f"/v1/tasks/{task_id}")).json()
                    if task["status"] != "succeeded":
                        return False
                return True

            await until(all_done, 60, "every task answered after the restart")
            ledger = await batches()
            tasks = [(await api.get(f"/v1/tasks/{i}")).json() for i in ids]
    finally:
        _stop(served)
        _stop(sim)
    assert ledger["batches"] == 1  # no second provider batch
    assert ledger["lines"] == TASKS and ledger["double_charged"] == []
    assert {t["tier"] for t in tasks} == {"batch"}
    assert [text_of(t["result"]) for t in tasks[:1]] == ["echo: product 0"]


async def _recorded(folder: Path) -> bool:
    db = sqlite3.connect(folder / "floodway.db")
    try:
        rows = db.execute("SELECT provider_id FROM upstream_batches").fetchall()
    finally:
        db.close()
    return bool(rows) and all(r[0] is not None for r in rows)
