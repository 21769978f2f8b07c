"""Multi-step jobs on both ledgers (SQLite, and a fresh PostgreSQL schema per test): results
flow as declared, each step's handler runs once, limits hold on each resource, the failure
policy, cancel and retry, tenants, and the order steps are served in."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from floodway import Context, FatalError, Floodway, IllegalTransition, Status
from floodway.config import JobsConfig, ResourceConfig, Settings
from floodway.core.errors import InvalidJob, JobNotFound
from floodway.testing import FakeClock
from harness.pg import fresh_schema, postgres_unavailable, schema_url
from tests.unit.test_jobs_model import INVALID

#: three resources with different limits (calls in flight at once)
CAPS = {"vision": 1, "llm": 2, "speech": 3}


@pytest.fixture(params=["sqlite", "postgres"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/jobs.db"
        return
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    async with fresh_schema() as schema:
        yield schema_url(schema)


class Provider:
    """Counts calls per work key and the calls in flight per resource (their peaks)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.by_step: Counter[str] = Counter()
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()

    async def call(self, resource: str, ctx: Context) -> None:
        self.calls[ctx.work_key] += 1
        self.by_step[str(ctx.task.metadata.get("step"))] += 1
        self.now[resource] += 1
        self.peak[resource] = max(self.peak[resource], self.now[resource])
        try:
            await asyncio.sleep(0.005)
        finally:
            self.now[resource] -= 1


def editor(ledger: str, provider: Provider) -> Floodway:
    settings = Settings(
        database=ledger,
        resources={name: ResourceConfig(concurrency=cap) for name, cap in CAPS.items()},
        jobs=JobsConfig(max_steps=10, max_items=100),  # the model test's limits
    )
    fw = Floodway(settings=settings)

    @fw.kind("understand", resource="vision")
    async def understand(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        await provider.call("vision", ctx)
        return {"scenes": [f"{value['video']}#{i}" for i in range(value["paragraphs"])]}

    @fw.kind("script", resource="llm")
    async def script(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        await provider.call("llm", ctx)
        return {"paragraphs": [f"text of {s}" for s in value["scenes"]]}

    @fw.kind("tts", resource="speech")
    async def tts(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        await provider.call("speech", ctx)
        return {"audio": f"{value['text']}.wav", "n": value["n"]}

    @fw.kind("subtitles", resource="llm")
    async def subtitles(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        await provider.call("llm", ctx)
        return {"srt": [a["audio"] for a in value["audio"]], "title": value["title"]}

    return fw


def chain(video: str, paragraphs: int = 10) -> list[dict[str, Any]]:
    return [
        {"name": "understand", "kind": "understand",
         "input": {"video": video, "paragraphs": paragraphs}},
        {"name": "script", "kind": "script",
         "input": {"scenes": "${steps.understand.result.scenes}"}, "after": ["understand"]},
        {"name": "tts", "kind": "tts", "input": {"text": "${item}", "n": "${index}"},
         "after": ["script"], "for_each": "${steps.script.result.paragraphs}"},
        {"name": "subtitles", "kind": "subtitles",
         "input": {"audio": "${steps.tts.results}", "title": "${steps.script.result.paragraphs.0}"},
         "after": ["tts"]},
    ]  # fmt: skip


async def test_a_four_step_job_with_a_fan_out_of_ten_flows_runs_each_step_once_within_limits(
    ledger: str,
) -> None:
    provider = Provider()
    async with editor(ledger, provider) as fw:
        jobs = [await fw.submit_job(chain(f"v{i}.mp4")) for i in range(3)]
        async with fw.worker(concurrency=16):
            done = [await fw.wait_job(j["id"], timeout=60) for j in jobs]
    for i, job in enumerate(done):
        assert job["status"] == "succeeded", job["error"]
        srt = job["result"]["subtitles"]["srt"]
        assert srt == [f"text of v{i}.mp4#{n}.wav" for n in range(10)]
        assert job["result"]["subtitles"]["title"] == f"text of v{i}.mp4#0"
        assert [len(s["tasks"]) for s in job["steps"]] == [1, 1, 10, 1]
        assert job["progress"] == {"steps": 4, "steps_done": 4, "tasks": 13, "tasks_done": 13}
    assert set(provider.calls.values()) == {1} and len(provider.calls) == 3 * 13
    assert provider.by_step == {"understand": 3, "script": 3, "tts": 30, "subtitles": 3}
    for resource, cap in CAPS.items():
        assert 1 <= provider.peak[resource] <= cap, resource


@pytest.mark.parametrize(("steps", "named", "word"), INVALID)
async def test_an_invalid_job_is_refused_naming_its_step_and_nothing_is_written(
    ledger: str, steps: Any, named: str | None, word: str
) -> None:
    provider = Provider()
    async with editor(ledger, provider) as fw:
        with pytest.raises(InvalidJob) as caught:
            await fw.submit_job(steps)
        assert caught.value.step == named
        assert await fw.list_jobs(tenant="default") == []
        assert await fw.list_tasks() == []


async def test_a_step_whose_kind_refuses_its_first_input_is_refused_naming_it(
    ledger: str,
) -> None:
    async with editor(ledger, Provider()) as fw:
        with pytest.raises(InvalidJob) as caught:
            await fw.submit_job(
                [{"name": "first", "kind": "script", "input": ["not", "an object"]}]
            )
        assert caught.value.step == "first" and "JSON object" in str(caught.value)
        assert await fw.list_tasks() == []


def failing(ledger: str, calls: Counter[str], fail: set[str]) -> Floodway:
    fw = Floodway(database=ledger)

    @fw.kind("step", max_attempts=1)
    async def step(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
        name = str(ctx.task.metadata["step"])
        calls[name] += 1
        if name in fail:
            raise FatalError(f"{name} refused")
        return {"from": name, "got": value}

    return fw


def line(*names: str, optional: str = "") -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        step: dict[str, Any] = {"name": name, "kind": "step", "input": {}}
        if i:
            step["after"] = [names[i - 1]]
            step["input"] = {"before": "${steps." + names[i - 1] + ".result.from}"}
        if name == optional:
            step["optional"] = True
        steps.append(step)
    return steps


async def test_a_failed_step_fails_the_job_and_a_retry_runs_only_it_and_what_follows(
    ledger: str,
) -> None:
    calls: Counter[str] = Counter()
    fail = {"b"}
    async with failing(ledger, calls, fail) as fw, fw.worker(concurrency=4):
        job = await fw.submit_job(line("a", "b", "c"))
        failed = await fw.wait_job(job["id"], timeout=30)
        assert failed["status"] == "failed"
        assert failed["error"]["step"] == "b" and "b refused" in failed["error"]["message"]
        assert [s["status"] for s in failed["steps"]] == ["succeeded", "failed", "waiting"]
        with pytest.raises(IllegalTransition):
            await fw.cancel_job(job["id"])
        fail.clear()
        await fw.retry_job(job["id"])
        done = await fw.wait_job(job["id"], timeout=30)
    assert done["status"] == "succeeded"
    assert done["result"] == {"c": {"from": "c", "got": {"before": "b"}}}
    assert calls == {"a": 1, "b": 2, "c": 1}


async def test_an_optional_step_that_fails_hands_null_to_its_dependants(ledger: str) -> None:
    calls: Counter[str] = Counter()
    async with failing(ledger, calls, {"b"}) as fw, fw.worker(concurrency=4):
        job = await fw.submit_job(line("a", "b", "c", optional="b"))
        done = await fw.wait_job(job["id"], timeout=30)
    assert done["status"] == "succeeded"
    assert done["result"] == {"c": {"from": "c", "got": {"before": None}}}


async def test_cancelling_a_job_cancels_its_waiting_tasks_and_starts_nothing_more(
    ledger: str,
) -> None:
    calls: Counter[str] = Counter()
    async with failing(ledger, calls, set()) as fw:
        job = await fw.submit_job(line("a", "b"))
        cancelled = await fw.cancel_job(job["id"])
        assert cancelled["status"] == "cancelled"
        assert cancelled["steps"][0]["tasks"][0]["status"] == "cancelled"
        async with fw.worker(concurrency=2):
            await asyncio.sleep(0.2)
        final = await fw.get_job(job["id"])
    assert calls == {} and final["steps"][1]["tasks"] == []
    assert final["status"] == "cancelled"


async def test_a_job_is_its_tenants_alone(ledger: str) -> None:
    async with failing(ledger, Counter(), set()) as fw:
        job = await fw.submit_job(line("a"), tenant="acme")
        with pytest.raises(JobNotFound):
            await fw.get_job(job["id"], tenant="globex")
        with pytest.raises(JobNotFound):
            await fw.cancel_job(job["id"], tenant="globex")
        assert await fw.list_jobs(tenant="globex") == []
        assert [j.id for j in await fw.list_jobs(tenant="acme")] == [job["id"]]
        task = await fw.get(job["steps"][0]["tasks"][0]["id"])
        assert task.tenant == "acme" and task.status is Status.QUEUED


async def test_steps_inherit_the_jobs_lane_and_share_its_deadline(ledger: str) -> None:
    async with failing(ledger, Counter(), set()) as fw:
        job = await fw.submit_job(line("a", "b", "c", "d"), lane="interactive", deadline_s=400)
        task = await fw.get(job["steps"][0]["tasks"][0]["id"])
    assert task.lane.value == "interactive"
    assert task.deadline_at is not None
    assert task.deadline_at - task.created_at == pytest.approx(100, abs=1)


async def test_a_shared_resource_serves_the_steps_of_the_jobs_submitted_first_first(
    ledger: str, clock: FakeClock
) -> None:
    """Each job: ``a`` on p (1 s), ``mid`` on q (0.5 s), ``b`` on p (1 s); p takes one call at
    a time. Job 0's ``b`` goes ahead of the ``a`` of jobs submitted after it (in submit order
    it would wait behind both), a plain task submitted between jobs 0 and 1 ranks between
    them, and an interactive task still goes ahead of every background step."""
    settings = Settings(
        database=ledger,
        resources={"p": ResourceConfig(concurrency=1), "q": ResourceConfig(concurrency=10)},
    )
    fw = Floodway(settings=settings, clock=clock)
    served: list[str] = []

    def handler(seconds: float) -> Any:
        async def call(ctx: Context, value: dict[str, Any]) -> dict[str, Any]:
            served.append(f"{value['job']}.{ctx.task.kind}")
            await clock.sleep(seconds)
            return value

        return call

    fw.kind("a", resource="p")(handler(1.0))
    fw.kind("mid", resource="q")(handler(0.5))
    fw.kind("b", resource="p")(handler(1.0))

    def job(n: int) -> list[dict[str, Any]]:
        return [
            {"name": "a", "kind": "a", "input": {"job": n}},
            {"name": "mid", "kind": "mid", "after": ["a"],
             "input": {"job": "${steps.a.result.job}"}},
            {"name": "b", "kind": "b", "after": ["mid"],
             "input": {"job": "${steps.mid.result.job}"}},
        ]  # fmt: skip

    async with fw:
        jobs = [await fw.submit_job(job(0))]
        await clock.advance(0.5)
        await fw.submit("a", {"job": "plain"})
        for n in (1, 2):
            await clock.advance(0.5 if n == 1 else 1.0)
            jobs.append(await fw.submit_job(job(n)))
        async with fw.worker(concurrency=8):
            while len(served) < 4:  # job 0's b is running
                await clock.advance(0.1)
            await fw.submit("a", {"job": "urgent"}, lane="interactive")
            done: list[dict[str, Any]] = []
            while clock.now() < 1_700_000_100:
                await clock.advance(0.1)
                done = [await fw.get_job(j["id"]) for j in jobs]
                if all(j["status"] != "running" for j in done):
                    break
    assert [j["status"] for j in done] == ["succeeded"] * 3
    on_p = [s for s in served if not s.endswith(".mid")]
    assert on_p == ["0.a", "plain.a", "0.b", "urgent.a", "1.a", "2.a", "1.b", "2.b"]
