"""What a new user meets first: errors as one line naming the fix, a task list that pages
both ways and never cuts an id, and batches that say why tasks failed (and exit 1)."""

from __future__ import annotations

import json
import re
import shlex
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from harness.processes import ROOT, spawn_floodway, until, until_healthy
from tests.acceptance.clirun import Served, cli, free_port, served
from tests.logdocs import LINE, call_for, log_calls, quoted_lines

TASK_ID = re.compile(r"\bt_[0-9A-Z]{26}\b")
NARROW = 80


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Served]:
    async with served(tmp_path) as serving:
        yield serving


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("given", "named"), [('"a red chair"', "not a string"), ("[1,2]", "not a list")]
)
async def test_input_that_is_not_an_object_is_one_line(given: str, named: str) -> None:
    code, _, err = await cli(
        "submit", "img", "--input", given, "--url", "http://127.0.0.1:9", columns=NARROW
    )
    line = one_error_line(err)
    assert code == 2 and named in line and '--input \'{"prompt": ' in line


def taken_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


async def test_start_up_errors_are_one_line_naming_the_fix(tmp_path: Path) -> None:
    holder, busy = taken_port()
    db = f"sqlite:///{tmp_path}/fw.db"
    cases: list[tuple[list[str], str]] = [
        (
            ["serve", "--database", f"postgresql://postgres@127.0.0.1:{free_port()}/test"],
            "is PostgreSQL running",
        ),
        (["serve", "--database", "mysql://db/x"], "unsupported database URL"),
        (["worker", "--database", "mysql://db/x"], "unsupported database URL"),
        (["migrate", "--database", "mysql://db/x"], "unsupported database URL"),
        (["serve", "--config", str(tmp_path / "missing.toml")], "no such config file"),
        (["serve", "--config", str(tmp_path)], "cannot read the config file"),
        (["serve", "--app", "no_such_module:fw"], "cannot load it"),
        (["serve", "--database", db, "--port", str(busy)], "pick another --port"),
        (["simulate", "--port", str(busy)], "pick another --port"),
    ]
    code, _, err = await cli("worker", "--database", db, "--redis", "localhost:6379")
    assert code == 2 and "redis: 'localhost:6379' is not a Redis URL" in err, err
    assert "Traceback" not in err
    try:
        for args, fix in cases:
            if args[0] == "serve" and "--port" not in args:
                args = [*args, "--port", str(free_port())]
            code, _, err = await cli(*args, columns=NARROW)
            assert code == 2, (args, err)
            assert fix in one_error_line(err), (args, err)
    finally:
        holder.close()


async def ids_of(page: str) -> list[str]:
    return TASK_ID.findall(page)


async def list_all(env: dict[str, str], *args: str) -> tuple[list[str], int]:
    """Follow ``next page:`` commands from the first page to the last: (ids, pages)."""
    ids: list[str] = []
    command = ["list", "--limit", "50", *args]
    pages = 0
    while True:
        code, out, err = await cli(*command, env=env, columns=NARROW)
        assert code == 0, err
        pages += 1
        ids += await ids_of(out)
        follow = [line for line in out.splitlines() if line.startswith("next page: ")]
        if not follow:
            return ids, pages
        argv = shlex.split(follow[0].removeprefix("next page: "))
        assert argv[:2] == ["floodway", "list"]
        command = argv[1:]


async def test_list_pages_through_120_tasks_newest_first_and_back(server: Served) -> None:
    lines = server.tmp / "many.jsonl"
    lines.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(120)))
    code, _, err = await cli("batch", str(lines), "--kind", "img", env=server.env)
    assert code == 0, err
    async with httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": "secret-key"}) as http:
        listed = (await http.get("/v1/tasks", params={"limit": 1000})).json()["items"]
    oldest_first = [t["id"] for t in listed]
    assert len(oldest_first) == 120

    newest, pages = await list_all(server.env)
    assert pages == 3 and newest == oldest_first[::-1]  # whole ids, at 80 columns
    oldest, pages = await list_all(server.env, "--oldest-first")
    assert pages == 3 and oldest == oldest_first


async def test_batch_wait_exits_1_and_says_why(server: Served) -> None:
    lines = server.tmp / "mixed.jsonl"
    bodies = [{"kind": "img", "input": {"prompt": f"p{i}"}} for i in range(4)]
    bodies += [{"kind": "img", "input": {"prompt": f"r{i}", "fail": "refusal"}} for i in range(5)]
    lines.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    code, out, err = await cli("batch", str(lines), "--wait", env=server.env, columns=NARROW)
    assert code == 1, err
    assert "9 tasks submitted (lines read as submit bodies)" in " ".join(out.split())
    assert "why 5 of 9 did not succeed:" in out
    assert "5 failed: fatal content_policy" in out
    assert "refused by the content policy" in out
    assert len(TASK_ID.findall(out.split("did not succeed")[1])) == 3  # a few examples
    assert max(len(line) for line in out.splitlines()) <= NARROW, out

    # The API's shape is taken as such: nothing from a submit body leaked into an input.
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": "Bearer secret-key"}
    ) as http:
        items = (await http.get("/v1/tasks", params={"limit": 100})).json()["items"]
    assert sorted(t["input"]["prompt"] for t in items) == sorted(
        b["input"]["prompt"] for b in bodies
    )

    good = server.tmp / "good.jsonl"
    good.write_text(json.dumps({"prompt": "fine"}) + "\n")
    code, out, err = await cli("batch", str(good), "--kind", "img", "--wait", env=server.env)
    assert code == 0 and "lines read as inputs" in " ".join(out.split()), err


async def test_batch_file_mistakes_name_the_line(tmp_path: Path) -> None:
    unreachable = {"FLOODWAY_URL": f"http://127.0.0.1:{free_port()}"}
    cases = [
        ('{"kind": "img", "input": {"a": 1}}\n{"a": 2}\n', "mix.jsonl:2: a plain input"),
        ('{"a": 1}\n{"kind": "img", "input": {"a": 2}}\n', "mix.jsonl:2: a submit body"),
        ('{"a": 1}\n[1]\n', "mix.jsonl:2: each line must be a JSON object"),
    ]
    for text, message in cases:
        (tmp_path / "mix.jsonl").write_text(text)
        code, _, err = await cli(
            "batch", str(tmp_path / "mix.jsonl"), "--kind", "img", env=unreachable
        )
        assert code == 2 and message in one_error_line(err), err
    for text, message in [
        ('{"input": {"a": 1}}\n', "mix.jsonl:1: no kind"),
        ("\n", "mix.jsonl holds no tasks"),
    ]:
        (tmp_path / "mix.jsonl").write_text(text)
        code, _, err = await cli("batch", str(tmp_path / "mix.jsonl"), env=unreachable)
        assert code == 2 and message in one_error_line(err), err


async def test_an_unreachable_redis_is_said_as_the_deploy_guide_quotes(tmp_path: Path) -> None:
    """Redis down at start-up: one line says so at once, dispatch says why it waits, /readyz
    is 503 and /healthz 200; the lines printed are the ones docs/deploy.md 5.2 quotes."""
    guide = (ROOT / "docs" / "deploy.md").read_text()
    section = guide[guide.index("### 5.2 Redis is unreachable") : guide.index("### 5.3")]
    quoted = quoted_lines(section)[:2]  # the start-up line and the dispatcher's
    calls = [call_for(line, log_calls()) for line in quoted]
    assert all(calls), quoted
    redis = f"redis://127.0.0.1:{free_port()}/0"
    config = tmp_path / "floodway.toml"
    config.write_text(f"""
database = "sqlite:///{tmp_path}/fw.db"
redis = "{redis}"
[resources.api]
concurrency = 2
[kinds.img]
adapter = "simulated"
url = "http://127.0.0.1:{free_port()}"
resource = "api"
""")
    port = free_port()
    log = tmp_path / "serve.log"
    proc = spawn_floodway(["serve", "--config", str(config), "--port", str(port)], {}, log)
    url = f"http://127.0.0.1:{port}"
    try:
        await until_healthy(url, 30, "floodway serve")
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/readyz")).status_code == 503
            submit = {"kind": "img", "input": {"prompt": "waits for Redis"}}
            assert (await http.post("/v1/tasks", json=submit)).status_code == 202

            def printed() -> list[tuple[str, str, str]]:
                found = [LINE.match(line) for line in log.read_text().splitlines()]
                return [(m["level"], m["logger"], m["message"]) for m in found if m]

            async def both_said() -> bool:
                return all(any(c.matches(*p) for p in printed()) for c in calls if c)

            await until(both_said, 30, "the start-up line and the dispatcher's")
            assert any(redis in message for _, _, message in printed())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
