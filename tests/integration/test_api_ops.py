"""``/v1/stats``, ``/metrics``, ``/healthz``, ``/docs``, ``/openapi.json`` and ``/``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from floodway.api.routes import ops
from floodway.api.routes.ops import DASHBOARD
from floodway.api.stats import Recent, summarize
from tests.integration.conftest import ApiServer, StartApi
from tests.integration.test_api_tasks import wait_terminal


async def finish_some(api: ApiServer, n: int) -> list[str]:
    http = await api.client()
    ids = []
    for i in range(n):
        ids.append(
            (await http.post("/v1/tasks", json={"kind": "sim", "input": {"i": i}})).json()["id"]
        )
    for task_id in ids:
        await wait_terminal(http, task_id)
    return ids


async def test_stats_counts_states_and_times_recent_tasks(api: ApiServer) -> None:
    await finish_some(api, 3)
    http = await api.client()
    fail = (await http.post("/v1/tasks", json={"kind": "sim", "input": {"fail": "refusal"}})).json()
    await wait_terminal(http, fail["id"])
    stats = (await http.get("/v1/stats")).json()
    assert stats["tasks"]["succeeded"] == 3 and stats["tasks"]["failed"] == 1
    assert stats["by_kind"]["sim"]["succeeded"] == 3
    assert stats["window"] == 4
    assert stats["completion"]["count"] == 3
    completion = stats["completion"]
    assert 0 <= completion["p50_s"] <= completion["p95_s"]
    assert 0 <= completion["mean_s"] <= completion["p95_s"]
    assert stats["queue_wait"]["count"] == 4
    assert stats["retries"] == 0 and stats["dead_letters"] == 0 and stats["retrying"] == 0
    assert stats["resources"] == {}  # no limits configured


async def test_metrics_use_the_apps_own_registry(start_api: StartApi) -> None:
    one, two = await start_api(), await start_api()
    await finish_some(one, 2)
    text = (await (await one.client()).get("/metrics")).text
    assert 'floodway_tasks{status="succeeded"} 2.0' in text
    assert 'floodway_task_completion_seconds_count{kind="sim"} 2.0' in text
    assert 'floodway_tasks_finished_total{error_type="",status="succeeded"} 2.0' in text
    assert 'floodway_api_responses_total{code="202"} 2.0' in text
    # A second scrape does not count the same finished tasks again.
    again = (await (await one.client()).get("/metrics")).text
    assert 'floodway_task_completion_seconds_count{kind="sim"} 2.0' in again
    # The other app in this process has its own numbers.
    other = (await (await two.client()).get("/metrics")).text
    assert 'floodway_tasks{status="succeeded"} 0.0' in other
    assert 'code="202"' not in other


async def test_health_docs_openapi_and_dashboard(api: ApiServer) -> None:
    http = await api.client()
    health = await http.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    docs = await http.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    spec = (await http.get("/openapi.json")).json()
    for path in (
        "/v1/tasks",
        "/v1/tasks/{task_id}",
        "/v1/tasks/{task_id}/retry",
        "/v1/tasks/{task_id}/events",
        "/v1/batches",
        "/v1/batches/{batch_id}",
        "/v1/webhooks/{kind}",
        "/v1/stats",
        "/metrics",
        "/healthz",
    ):
        assert path in spec["paths"], path
    submit = spec["paths"]["/v1/tasks"]["post"]["responses"]
    assert set(submit) >= {"200", "202", "409", "422", "429"}
    assert "application/problem+json" in submit["429"]["content"]
    assert "Retry-After" in submit["429"]["headers"]
    home = await http.get("/")
    assert home.status_code == 200 and home.headers["content-type"].startswith("text/html")
    if DASHBOARD.is_file():  # the dashboard page, with its assets under /static
        for asset in re.findall(r'(?:src|href)="(static/[^"]+)"', home.text):
            assert (await http.get(f"/{asset}")).status_code == 200, asset
    else:
        assert "/docs" in home.text  # the fallback page points at the API reference


async def test_recent_window_finds_the_newest_tasks(start_api: StartApi) -> None:
    server = await start_api(run_workers=False)
    recent = Recent(size=4)
    assert (await recent.window(server.fw)).tasks == ()
    ids = [(await server.fw.submit("sim", {"i": i})).id for i in range(11)]
    window = await recent.window(server.fw)
    assert [t.id for t in window.tasks] == ids[-4:]
    more = [(await server.fw.submit("sim", {"j": i})).id for i in range(3)]
    window = await recent.window(server.fw)
    assert [t.id for t in window.tasks] == (ids + more)[-4:]


def test_summarize_mean_and_nearest_rank_p95() -> None:
    timing = summarize([float(v) for v in range(1, 101)])
    assert timing.count == 100 and timing.mean_s == 50.5
    assert timing.p50_s == 50.0 and timing.p95_s == 95.0
    assert summarize([]).count == 0 and summarize([]).p95_s is None


async def test_home_page_falls_back_without_a_dashboard(
    api: ApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ops, "DASHBOARD", tmp_path / "missing" / "index.html")
    home = await (await api.client()).get("/")
    assert home.status_code == 200 and home.headers["content-type"].startswith("text/html")
    assert 'href="/docs"' in home.text
