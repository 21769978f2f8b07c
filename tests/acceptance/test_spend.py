"""The spend ledger against the provider's own, and budgets against concurrent submitters,
with real processes: ``floodway worker`` processes (one SIGKILLed mid-run) and two
``floodway api`` processes on one ledger (SQLite, or PostgreSQL with Redis)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import psycopg
import pytest

from floodway import Floodway
from floodway.core.states import TERMINAL, Status
from floodway.providers.sim import SimulatorConfig, running_simulator
from floodway.store.base import SpendQuery
from harness.fleet import (
    KIND,
    PG_URL,
    build,
    fresh_database,
    private_redis,
    spawn_api,
    spawn_worker,
)
from harness.processes import until

pytestmark = pytest.mark.slow

#: per million tokens: a call of ~150 tokens costs about 0.375, so cents are visible
PRICE_IN = 2500.0


async def all_terminal(fw: Floodway, n: int) -> bool:
    stats = await fw.store.stats()
    return sum(stats.by_status[s.value] for s in TERMINAL) >= n


async def test_spend_equals_the_providers_ledger_after_retries_dedupe_and_a_sigkill(
    tmp_path: Path,
) -> None:
    database = f"sqlite:///{tmp_path}/fw.db"
    config = SimulatorConfig(
        latency_ms=60,
        latency_jitter=0.2,
        max_concurrency=10,
        error_rate=0.08,
        rate_limit_rate=0.05,
        seed=11,
    )
    env = {"FLOODWAY_RESOURCES__SIM__PRICE__INPUT_PER_1M": str(PRICE_IN)}
    inputs = [{"n": i, "tokens": 100 + i} for i in range(100)]
    inputs += inputs[:20]  # the same work again: deduped, never billed
    async with running_simulator(config) as sim:
        fw = build(database, sim.url, redis="")
        async with fw:
            tasks = await fw.submit_many(KIND, inputs)
            first = spawn_worker(database, "", sim.url, tmp_path / "w1.log", extra_env=env)

            async def some_billed() -> bool:
                return sim.state.ledger.total >= 30

            await until(some_billed, 60, "30 calls billed")
            first.kill()
            assert sim.state.ledger.total < 100, "the run finished before the kill"
            second = spawn_worker(database, "", sim.url, tmp_path / "w2.log", extra_env=env)
            try:
                await until(lambda: all_terminal(fw, len(tasks)), 120, "every task terminal")
            finally:
                assert second.stop() == 0
            final = [await fw.get(t.id) for t in tasks]
            report = await fw.store.spend(SpendQuery(since=0.0))
    assert {t.status for t in final} <= {Status.SUCCEEDED, Status.DEDUPED}
    assert sum(t.status is Status.DEDUPED for t in final) == 20
    ledger = sim.state.ledger
    assert ledger.as_dict()["double_charged"] == []
    stats = sim.state.stats
    assert stats.rate_limited > 0 and stats.errors_5xx > 0  # retries were needed
    (line,) = report.lines
    billed = ledger.total_tokens * PRICE_IN / 1_000_000
    # To the cent, and closer: float sums, not rounding, are all that separate them.
    assert line.cost == pytest.approx(billed, abs=1e-9)
    assert (line.calls, line.input_tokens) == (ledger.total, ledger.total_tokens)
    saved = sum(100 + i for i in range(20)) * PRICE_IN / 1_000_000
    assert (line.deduped, line.saved) == (20, pytest.approx(saved, abs=1e-9))


def _postgres_and_redis_missing() -> str | None:
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL at {PG_URL} is unavailable: {exc}"
    return None


@asynccontextmanager
async def ledger_of(backend: str, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """(database, redis) of a fresh ledger: a SQLite file, or PostgreSQL and a private Redis."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path}/fw.db", ""
        return
    missing = _postgres_and_redis_missing()
    if missing:
        pytest.skip(missing)
    async with fresh_database() as database, private_redis(tmp_path / "redis") as redis:
        yield database, redis.url


PER_TASK = 0.03
BUDGET = 1.0
FITS = 33  # 33 x 0.03 = 0.99; a 34th would make 1.02


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_budget_holds_under_50_concurrent_submits_to_two_api_processes(
    tmp_path: Path, backend: str
) -> None:
    env = {
        "FLOODWAY_RESOURCES__SIM__PRICE__PER_REQUEST": str(PER_TASK),
        "FLOODWAY_TENANTS__BUDGET__AMOUNT": str(BUDGET),
    }
    async with (
        ledger_of(backend, tmp_path) as (database, redis),
        running_simulator(SimulatorConfig(latency_ms=20, seed=3)) as sim,
        AsyncExitStack() as stack,
    ):
        apis = [
            spawn_api(database, redis, sim.url, tmp_path / f"api{i}.log", extra_env=env)
            for i in range(2)
        ]
        for api in apis:
            stack.callback(api.stop, 10)
        # A worker runs meanwhile: tasks settle (their holds turn into spend) while others
        # are being admitted.
        worker = spawn_worker(database, redis, sim.url, tmp_path / "w.log", extra_env=env)
        stack.callback(worker.stop, 10)
        for api in apis:
            await until(api.healthy, 60, "the API process answers")

        async def worker_started() -> bool:
            return worker.ready()

        await until(worker_started, 60, "the worker started")
        async with httpx.AsyncClient(timeout=30) as http:

            async def submit(i: int) -> httpx.Response:
                url = f"{apis[i % 2].url}/v1/tasks"
                return await http.post(url, json={"kind": KIND, "input": {"n": i}})

            answers = await asyncio.gather(*[submit(i) for i in range(50)])
            codes = sorted(a.status_code for a in answers)
            assert codes == [202] * FITS + [402] * (50 - FITS), codes
            refused = next(a for a in answers if a.status_code == 402)
            assert refused.headers["content-type"] == "application/problem+json"
            problem = refused.json()
            assert problem["type"].endswith("budget-exceeded")
            assert problem["budget"] == BUDGET and problem["left"] < PER_TASK
            assert problem["resets_at"] in problem["detail"] and refused.headers["retry-after"]
            batch = await http.post(
                f"{apis[0].url}/v1/batches",
                json={"tasks": [{"kind": KIND, "input": {"n": 100 + i}} for i in range(2)]},
            )
            assert batch.status_code == 402, batch.text
            fw = build(database, sim.url, redis=redis)
            async with fw:
                await until(lambda: all_terminal(fw, FITS), 60, "every accepted task ran")
                assert sum((await fw.store.stats()).by_status.values()) == FITS
                (line,) = (await fw.store.spend(SpendQuery(since=0.0))).lines
            view = (await http.get(f"{apis[1].url}/v1/spend")).json()
    assert line.calls == sim.state.ledger.total == FITS
    assert line.cost == pytest.approx(FITS * PER_TASK)
    assert max(0.0, line.cost - BUDGET) == 0.0  # the overspend
    (budget,) = view["budgets"]
    assert budget["spent"] == pytest.approx(FITS * PER_TASK) and budget["held"] == 0
