"""The library path as a newcomer takes it: resources declared from Python, and a kind that
names a resource declared nowhere refused rather than run without limits."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from floodway import ConfigError, Context, Floodway, Status
from floodway.config import ResourceConfig
from floodway.core.backoff import Backoff
from floodway.core.retry import RetryPolicy
from floodway.kinds import KindSpec


async def noop(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
    return {}


def test_a_kind_naming_an_undeclared_resource_is_refused_saying_how_to_declare_it(
    tmp_path: Path,
) -> None:
    fw = Floodway(database=f"sqlite:///{tmp_path}/a.db")
    with pytest.raises(ConfigError) as refused:
        fw.kind("summarize", resource="llm")(noop)
    text = str(refused.value)
    assert "'summarize'" in text and "'llm'" in text and "declared nowhere" in text
    assert "[resources.llm]" in text and "Floodway(..., resources=" in text


def test_a_near_miss_resource_name_is_offered(tmp_path: Path) -> None:
    fw = Floodway(database=f"sqlite:///{tmp_path}/a.db", resources={"image-api": {}})
    with pytest.raises(ConfigError, match="did you mean 'image-api'"):
        fw.kind("img", resource="image_api")(noop)


async def test_a_kind_added_past_the_decorator_is_checked_at_open(tmp_path: Path) -> None:
    fw = Floodway(database=f"sqlite:///{tmp_path}/a.db")
    fw.kinds.add(KindSpec("img", noop, resource="gpu"))
    with pytest.raises(ConfigError, match="'gpu', which is declared nowhere"):
        await fw.open()


def test_resources_declared_from_python_are_checked_as_the_file_s_are(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"resources\.llm\.concurrency"):
        Floodway(database=f"sqlite:///{tmp_path}/a.db", resources={"llm": {"concurrency": -1}})
    config = tmp_path / "floodway.toml"
    config.write_text(f'database = "sqlite:///{tmp_path}/b.db"\n[resources.llm]\nconcurrency = 2\n')
    with pytest.raises(ConfigError, match="declare it once"):
        Floodway(config=config, resources={"llm": ResourceConfig(concurrency=3)})


async def test_a_resource_declared_from_python_holds_its_kinds_to_its_limit(
    tmp_path: Path,
) -> None:
    fw = Floodway(
        database=f"sqlite:///{tmp_path}/a.db", resources={"llm": ResourceConfig(concurrency=2)}
    )
    running, peak, release, two = 0, 0, asyncio.Event(), asyncio.Event()

    @fw.kind("summarize", resource="llm")
    async def summarize(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 2:
            two.set()
        await release.wait()
        running -= 1
        return {}

    async with fw, fw.worker(concurrency=8):
        tasks = [await fw.submit("summarize", {"n": n}) for n in range(6)]
        await asyncio.wait_for(two.wait(), 30)
        await asyncio.sleep(0.2)  # room for a third to start, were the limit not held
        assert running == 2
        release.set()
        done = [await fw.wait(t.id, timeout=30) for t in tasks]
    assert peak == 2 and all(t.status is Status.SUCCEEDED for t in done)


async def test_a_bug_in_a_handler_is_logged_once_per_attempt_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fw = Floodway(
        database=f"sqlite:///{tmp_path}/a.db",
        policy=RetryPolicy(backoff=Backoff(base_s=0.01, cap_s=0.01)),
    )

    @fw.kind("buggy", max_attempts=2)
    async def buggy(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("a bug")

    caplog.set_level(logging.ERROR, logger="floodway.worker")
    async with fw.worker(concurrency=2):
        task = await fw.submit("buggy", {})
        done = await fw.wait(task.id, timeout=30)
    assert done.status is Status.DEAD and done.attempts == 2
    assert done.error is not None and done.error.type == "unexpected"
    assert "ValueError: a bug" in done.error.message
    logged = [r for r in caplog.records if task.id in r.getMessage()]
    assert [f"attempt {n}" in r.getMessage() for n, r in enumerate(logged, 1)] == [True, True]
    assert all(r.exc_info and r.exc_info[0] is ValueError for r in logged)  # the traceback


def test_kind_keywords_are_the_config_s_keys_and_take_its_durations(tmp_path: Path) -> None:
    fw = Floodway(database=f"sqlite:///{tmp_path}/a.db")
    fw.kind("k", deadline="15m", timeout="500ms", max_attempts=2)(noop)
    spec = fw.kinds.get("k")
    assert (spec.deadline_s, spec.timeout_s, spec.max_attempts) == (900.0, 0.5, 2)
    with pytest.raises(ConfigError, match="not a duration"):
        fw.kind("bad", deadline="soon")(noop)
