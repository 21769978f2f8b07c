"""The CLI end to end: `floodway serve` in a subprocess, the client commands against it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness.processes import ROOT
from tests.acceptance.clirun import cli, free_port, served


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    async with served(tmp_path) as serving:
        yield serving.url, serving.tmp


async def test_submit_get_list_stats_batch_dlq(server: tuple[str, Path]) -> None:
    url, tmp = server
    auth = {"FLOODWAY_URL": url, "FLOODWAY_API_KEY": "secret-key"}
    code, out, _ = await cli(
        "submit", "img", "--input", '{"prompt": "a cat"}', "--wait", "--key", "k1", env=auth
    )
    assert code == 0, out
    task = json.loads(out)
    assert task["status"] == "succeeded" and task["tenant"] == "acme"
    code, out, _ = await cli(
        "submit", "img", "--input", '{"prompt": "a cat"}', "--key", "k1", env=auth
    )
    assert json.loads(out)["id"] == task["id"] and json.loads(out)["reused"] is True
    code, out, _ = await cli("get", task["id"], env=auth)
    assert code == 0 and json.loads(out)["result"]["echo"] == {"prompt": "a cat"}

    lines = tmp / "batch.jsonl"
    lines.write_text("\n".join(json.dumps({"prompt": f"p{i}"}) for i in range(12)) + "\n")
    code, out, _ = await cli("batch", str(lines), "--kind", "img", "--wait", env=auth)
    assert code == 0 and "12 tasks submitted" in out and "succeeded" in out
    batch_id = re.search(r"batch (\S+): 12 tasks submitted", out)
    assert batch_id is not None
    code, out, _ = await cli("batch", "show", batch_id[1], env=auth)
    shown = json.loads(out)
    assert code == 0 and shown["total"] == 12 and shown["done"] and shown["counts"]["succeeded"]
    code, out, _ = await cli("kinds", "--json", env=auth)
    assert code == 0 and [k["name"] for k in json.loads(out)] == ["img"]

    code, out, _ = await cli("list", "--status", "succeeded", env=auth)
    assert code == 0 and task["id"] in out
    code, out, _ = await cli("list", "--json", "--limit", "2", env=auth)
    page = json.loads(out)
    assert code == 0 and len(page["items"]) == 2 and page["next"]
    code, _, err = await cli("retry", task["id"], env=auth)  # a finished task: nothing to do
    assert code == 1 and "already succeeded: nothing to retry" in err
    code, _, err = await cli("cancel", task["id"], env=auth)
    assert code == 1 and "already succeeded: nothing to cancel" in err
    code, _, err = await cli("submit", "imgg", "--input", "{}", env=auth)
    assert code == 1 and "did you mean 'img'?" in err and "known kinds: img" in err
    code, out, _ = await cli("stats", env=auth)
    assert code == 0 and json.loads(out)["tasks"]["succeeded"] >= 13
    code, out, _ = await cli("dlq", "list", env=auth)
    assert code == 0 and "dead letters (0)" in out


async def test_clear_errors_without_tracebacks(server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server
    code, _, err = await cli("get", "t_nope", "--url", url, "--api-key", "wrong")
    assert code == 1 and "refused the API key" in err and "Traceback" not in err
    code, _, err = await cli("get", "t_nope", "--url", url, "--api-key", "secret-key")
    assert code == 1 and "no task" in err and "Traceback" not in err
    code, _, err = await cli("submit", "img", "--input", "{not json", "--url", url)
    assert code == 2 and "--input is not JSON" in err
    code, _, err = await cli("stats", "--url", f"http://127.0.0.1:{free_port()}")
    assert code == 1 and "cannot reach a floodway server" in err and "Traceback" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ok": 1}\n[1, 2]\n')
    code, _, err = await cli("batch", str(bad), "--kind", "img", "--url", url)
    assert code == 2 and "bad.jsonl:2" in err


async def test_bad_config_names_the_key_and_file(tmp_path: Path) -> None:
    config = tmp_path / "floodway.toml"
    config.write_text("[resources.llm]\nconcurrency = -3\n")
    code, _, err = await cli("worker", "--config", str(config))
    assert code == 2 and "resources.llm.concurrency" in err and str(config) in err
    assert "Traceback" not in err


async def test_serve_with_no_kinds_says_so_at_start(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "floodway.cli",
        "serve",
        "--database",
        f"sqlite:///{tmp_path}/none.db",
        "--port",
        str(free_port()),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stderr is not None
    said = []
    try:
        async with asyncio.timeout(30):
            while not said or "floodway on" not in said[-1]:
                said.append((await proc.stderr.readline()).decode())
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    assert any("no kinds are configured" in line and "--config" in line for line in said), said
