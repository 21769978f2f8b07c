"""The dashboard's list views and what a tenant's key shows, in a real browser (Debian's
Chromium) against a real API server: the task list, batches, workers, the per-kind breakdown,
a task's attempts, the time range, and the key passed after the #."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.browser.conftest import TERMINAL, Dash, StartDash, Watched, eventually

OpenPage = Any  # the open_page fixture: (url, *, wait_for=...) -> Watched


async def row_ids(page: Any, body: str, attr: str = "taskId") -> list[str]:
    return list(
        await page.locator(f"{body} tr").evaluate_all(f"rows => rows.map(r => r.dataset.{attr})")
    )


async def all_task_ids(dash: Dash) -> list[str]:
    """Every task of the caller's tenant, newest first, through the API's own paging."""
    ids: list[str] = []
    after = None
    while True:
        params = {"order": "desc", "limit": 1000, **({"after": after} if after else {})}
        page = (await dash.http.get("/v1/tasks", params=params)).json()
        ids += [t["id"] for t in page["items"]]
        if not page["next"]:
            return ids
        after = page["next"]


async def test_the_task_list_filters_and_pages(dash: Dash, open_page: OpenPage) -> None:
    watched: Watched = await open_page(dash.url)
    page = watched.page
    await page.wait_for_selector("#tasks-rows tr")
    await page.select_option("#tasks-status", "dead")
    await page.wait_for_selector("#tasks-rows tr[data-status='dead']")
    await page.wait_for_function(
        "() => [...document.querySelectorAll('#tasks-rows tr')]"
        ".every(r => r.dataset.status === 'dead')"
    )
    assert sorted(await row_ids(page, "#tasks-rows")) == sorted(dash.ids["dead"])

    await page.select_option("#tasks-status", "")
    await page.select_option("#tasks-kind", "sim")
    await page.wait_for_function(
        "() => [...document.querySelectorAll('#tasks-rows tr td:nth-child(2)')]"
        ".every(c => c.textContent === 'sim')"
    )
    sims = {*dash.ids["succeeded"], *dash.ids["failed"]}
    assert set(await row_ids(page, "#tasks-rows")) == sims

    # Every task once, newest first, ten to a page; and back again.
    await page.select_option("#tasks-kind", "")
    await page.select_option("#tasks-limit", "10")
    await page.wait_for_selector('#tasks-page[data-page="1"]')
    expected = await all_task_ids(dash)
    assert len(expected) > 10
    seen: list[str] = []
    number = 1
    while True:
        await page.wait_for_function(
            f"() => document.querySelector('#tasks-page').dataset.page === '{number}'"
        )
        await page.wait_for_function("() => document.querySelectorAll('#tasks-rows tr').length > 0")
        seen += await row_ids(page, "#tasks-rows")
        if await page.is_disabled("#tasks-next"):
            break
        await page.click("#tasks-next")
        number += 1
    assert seen == expected
    await page.click("#tasks-prev")
    await page.wait_for_selector(f'#tasks-page[data-page="{number - 1}"]')
    assert await row_ids(page, "#tasks-rows") == expected[(number - 2) * 10 : (number - 1) * 10]
    assert watched.errors == []


async def test_cancel_and_retry_from_the_task_list(dash: Dash, open_page: OpenPage) -> None:
    watched = await open_page(dash.url)
    page = watched.page
    queued = dash.ids["queued"][0]
    await page.select_option("#tasks-status", "queued")
    await page.click(f'button[data-cancel="{queued}"]')
    await page.wait_for_selector(f'#tasks-message:has-text("Task {queued} is cancelled")')
    assert await dash.status(queued) == "cancelled"

    failed = dash.ids["failed"][0]
    await page.select_option("#tasks-status", "failed")
    await page.click(f'button[data-retry-task="{failed}"]')
    await page.wait_for_selector(f'#tasks-message:has-text("Task {failed} is")')
    await dash.settle([failed], TERMINAL)  # a refusal again: it ran, and failed, twice
    events = await dash.fw.events(failed)
    assert [e.status.value for e in events].count("failed") == 2
    # A task that has ended offers no cancel; one still waiting offers no retry.
    await page.select_option("#tasks-status", "succeeded")
    await page.wait_for_selector("#tasks-rows tr[data-status='succeeded']")
    assert await page.locator("#tasks-rows button[data-cancel]").count() == 0
    assert watched.errors == []


async def test_batches_show_their_progress_and_list_their_tasks(
    dash: Dash, open_page: OpenPage
) -> None:
    body = {"tasks": [{"kind": "sim", "input": {"batch": n}} for n in range(4)]}
    batch = (await dash.http.post("/v1/batches", json=body)).json()
    await dash.settle(batch["task_ids"], TERMINAL)
    waiting = (
        await dash.http.post("/v1/batches", json={"tasks": [{"kind": "slow", "input": {"b": 1}}]})
    ).json()
    watched = await open_page(dash.url)
    page = watched.page
    await page.wait_for_selector(
        f'#batches-rows tr[data-batch-id="{batch["id"]}"][data-done="true"]'
    )
    assert await row_ids(page, "#batches-rows", "batchId") == [waiting["id"], batch["id"]]
    done = page.locator(f'#batches-rows tr[data-batch-id="{batch["id"]}"]')
    assert (await done.locator(".meter").get_attribute("aria-valuenow")) == "100"
    assert "4 / 4" in await done.inner_text()
    open_one = page.locator(f'#batches-rows tr[data-batch-id="{waiting["id"]}"]')
    assert (await open_one.get_attribute("data-done")) == "false"
    await done.locator("button").click()
    await page.wait_for_function("() => document.querySelectorAll('#tasks-rows tr').length === 4")
    assert sorted(await row_ids(page, "#tasks-rows")) == sorted(batch["task_ids"])
    assert await page.input_value("#tasks-batch") == batch["id"]
    assert watched.errors == []


async def test_workers_show_what_each_one_runs(dash: Dash, open_page: OpenPage) -> None:
    watched = await open_page(dash.url)
    page = watched.page
    await page.wait_for_selector("#workers-rows tr")
    answer = (await dash.http.get("/v1/workers")).json()
    (worker,) = answer["workers"]
    row = page.locator(f'#workers-rows tr[data-worker="{worker["id"]}"]')
    cells = await row.locator("td").all_inner_texts()
    assert cells[0] == worker["host"] and cells[1] == str(worker["pid"])
    assert cells[2] == f"{len(worker['tasks'])} / {worker['concurrency']}"
    running = dash.ids["running"][0]
    assert running in {t["id"] for t in worker["tasks"]} and running in cells[5]
    # A task it runs opens in the task view.
    await row.locator("button", has_text=running).click()
    await page.wait_for_selector(f'#task-title:has-text("{running}")')
    assert watched.errors == []


async def test_the_per_kind_breakdown_matches_stats_and_spend(
    dash: Dash, open_page: OpenPage
) -> None:
    watched = await open_page(dash.url)
    page = watched.page
    await page.wait_for_selector("#kinds-rows tr[data-kind='chat']")
    await page.wait_for_function(
        "() => Number(document.querySelector(\"#kinds-rows tr[data-kind='chat'] [data-cost]\")"
        ".dataset.cost) > 0"
    )
    stats = await dash.stats()
    spend = (await dash.http.get("/v1/spend", params={"since": "24h"})).json()
    for kind, counts in stats["by_kind"].items():
        row = page.locator(f"#kinds-rows tr[data-kind='{kind}']")
        for status, n in counts.items():
            assert await row.locator(f"[data-status='{status}']").inner_text() == str(n)
    cost = await page.get_attribute("#kinds-rows tr[data-kind='chat'] [data-cost]", "data-cost")
    assert float(str(cost)) == sum(x["cost"] for x in spend["lines"] if x["kind"] == "chat")
    assert watched.errors == []


async def test_the_time_range_sets_the_spend_span_and_the_charts_window(
    dash: Dash, open_page: OpenPage
) -> None:
    watched = await open_page(f"{dash.url}/#range=1h")
    page = watched.page
    assert await page.input_value("#range") == "1h"
    await page.wait_for_selector("#spend-bars .spend-bar", state="attached")
    assert await page.locator("#spend-bars .spend-bar").count() == 12  # 5-minute bars
    spent = [str(u) for u in watched.requests if httpx.URL(u).path == "/v1/spend"]
    assert spent and all(httpx.URL(u).params["since"] == "1h" for u in spent)
    await page.select_option("#range", "7d")
    await page.wait_for_function(
        "() => document.querySelectorAll('#spend-bars .spend-bar').length === 28"
    )
    assert "range=7d" in await page.evaluate("location.hash")
    assert await page.inner_text("#spend-empty") == "Nothing billed in the last 7 days."
    assert watched.errors == []


async def test_a_tasks_attempts_and_a_retry_from_its_view(dash: Dash, open_page: OpenPage) -> None:
    watched = await open_page(dash.url)
    page = watched.page
    task_id = dash.ids["dead"][0]
    await page.fill("#task-id", task_id)
    await page.press("#task-id", "Enter")
    await page.wait_for_selector('#events-state:has-text("ended (dead)")')
    assert await page.locator("#task-attempts li").count() == 1
    assert await page.get_attribute("#task-attempts li", "data-ended") == "dead"
    assert await page.locator("#task-cancel").count() == 0
    dash.flip.error_rate = 0.0  # the provider has recovered
    await page.click("#task-retry")
    await page.wait_for_selector('#events-state:has-text("ended (succeeded)")')
    ended = await page.locator("#task-attempts li").evaluate_all(
        "items => items.map(i => [i.dataset.run, i.dataset.attempt, i.dataset.ended])"
    )
    assert ended == [["1", "1", "dead"], ["2", "1", "succeeded"]]  # a retry: a new run
    assert "retry 1" in await page.inner_text("#task-attempts li[data-run='2']")
    assert watched.errors == []


async def test_cost_is_money_when_the_kind_has_a_price(dash: Dash, open_page: OpenPage) -> None:
    watched = await open_page(dash.url)
    texts = await watched.page.evaluate(
        """async () => {
        const {costText} = await import("./static/format.js");
        return [costText({estimated: 1, actual: 1, held: 0.04}),
                costText({estimated: 1100, actual: null, held: 0})];
    }"""
    )
    assert texts == [
        "0.04 estimated at the kind's price (1 units, 1 used)",
        "1,100 units estimated (the kind has no price)",
    ]
    # The fixture's priced kind (chat, on "llm") in money; a free one (sim) in units.
    page = watched.page
    for task_id, priced in ((dash.ids["chat"][0], True), (dash.ids["succeeded"][0], False)):
        cost = (await dash.http.get(f"/v1/tasks/{task_id}")).json()["cost"]
        assert (cost["held"] > 0) is priced
        await page.fill("#task-id", task_id)
        await page.press("#task-id", "Enter")
        await page.wait_for_selector(f'#task-title:has-text("{task_id}")')
        fields = await page.inner_text("#task-fields")
        expected = await page.evaluate(
            """async (cost) => (await import("./static/format.js")).costText(cost)""", cost
        )
        assert expected in fields
        assert ("at the kind's price" in fields) is priced
    assert watched.errors == []


async def test_a_tenant_key_after_the_hash_shows_that_tenant_only(
    start_dash: StartDash, open_page: OpenPage, screenshots: Path
) -> None:
    dash = await start_dash(keys={"key-a": "tenant-a"})
    history = dash.app.state.api.history

    async def sampled() -> bool:
        return len(history.samples()) >= 3

    await eventually(sampled)
    watched = await open_page(f"{dash.url}/#key=key-a", wait_for="#states-total[data-value]")
    page = watched.page
    assert await page.evaluate("location.hash") == ""  # the key left the address bar
    assert await page.evaluate("localStorage.getItem('floodway.apiKey')") == "key-a"
    assert all("key-a" not in url for url in watched.requests)
    assert "(tenant tenant-a)" in await page.inner_text("#states-total")
    # Its charts open drawn from its own samples.
    assert await page.evaluate("window.floodwayDashboard.history.samples.length") >= 3
    assert watched.count("/v1/stats/history") == 1
    # The limits that hold its work back: its kinds' resource, its own tasks in flight.
    card = page.locator('[data-resource="slow-api"]')
    await card.wait_for()
    assert "1 of this tenant's tasks · limit 1 for every tenant" in await card.inner_text()
    assert "used by slow" in await card.inner_text()
    assert "no resource limits" not in (await page.inner_text("main")).lower()
    # Workers hold every tenant's tasks: an operator key shows them.
    await page.wait_for_selector('#workers-message:has-text("operator key")')
    assert await page.is_hidden("#workers-table")
    await page.locator("#resources-title").scroll_into_view_if_needed()
    await page.screenshot(path=str(screenshots / "dashboard-tenant.png"), full_page=True)
    assert [e for e in watched.errors if "403" not in e] == []


async def test_the_dead_letter_badge_counts_what_its_list_lists(
    dash: Dash, open_page: OpenPage
) -> None:
    """An operator's stats count every tenant's dead letters; the list, and so the badge, are
    the key's own tenant's."""
    theirs = [
        (await dash.fw.submit("flip", {"other": n}, tenant="tenant-b", max_attempts=1)).id
        for n in range(2)
    ]

    async def dead() -> bool:
        return all([(await dash.fw.get(t)).status.value == "dead" for t in theirs])

    await eventually(dead)
    stats = await dash.stats()
    assert stats["tenant"] is None and stats["dead_letters"] == len(dash.ids["dead"]) + 2
    watched = await open_page(dash.url)
    page = watched.page
    await page.wait_for_selector(f'#dead-count[data-value="{len(dash.ids["dead"])}"]')
    assert len(await row_ids(page, "#dead-rows")) == len(dash.ids["dead"])
    assert "(all tenants)" in await page.inner_text("#states-total")
    assert watched.errors == []


async def test_a_key_in_the_query_string_is_not_used(
    start_dash: StartDash, open_page: OpenPage
) -> None:
    dash = await start_dash(keys={"key-a": "tenant-a"})
    watched = await open_page(f"{dash.url}/?key=key-a", wait_for="#auth-message:visible")
    page = watched.page
    assert "query string" in await page.inner_text("#auth-message")
    sent = [r for r in watched.requests if "/v1/" in r]
    assert sent  # it polled, without the key: 401s
    assert await page.evaluate("localStorage.getItem('floodway.apiKey')") is None


async def test_screenshots_of_the_views(dash: Dash, open_page: OpenPage, screenshots: Path) -> None:
    """Pictures of the list views and of a task's attempts (kept in docs/screenshots/)."""
    body = {"tasks": [{"kind": "sim", "input": {"shot": n}} for n in range(6)]}
    batch = (await dash.http.post("/v1/batches", json=body)).json()
    await dash.settle(batch["task_ids"], TERMINAL)
    watched = await open_page(dash.url)
    page = watched.page
    await page.wait_for_selector("#workers-rows tr")
    await page.wait_for_selector("#batches-rows tr")
    await page.wait_for_selector("#kinds-rows tr")
    for name, section in (
        ("dashboard-tasks.png", "#tasks-title"),
        ("dashboard-batches.png", "#batches-title"),
        ("dashboard-workers.png", "#workers-title"),
        ("dashboard-kinds.png", "#kinds-title"),
    ):
        target = page.locator("section", has=page.locator(section))
        await target.screenshot(path=str(screenshots / name))
        assert (screenshots / name).stat().st_size > 5_000
    dash.flip.error_rate = 0.0
    dead = dash.ids["dead"][0]
    await page.fill("#task-id", dead)
    await page.press("#task-id", "Enter")
    await page.wait_for_selector('#events-state:has-text("ended (dead)")')
    await page.click("#task-retry")
    await page.wait_for_selector('#events-state:has-text("ended (succeeded)")')
    await page.locator("section", has=page.locator("#search-title")).screenshot(
        path=str(screenshots / "dashboard-task.png")
    )
    assert watched.errors == []


async def test_a_job_is_shown_as_its_steps(
    dash: Dash, open_page: OpenPage, screenshots: Path
) -> None:
    body = {
        "steps": [
            {"name": "draft", "kind": "sim", "input": {"job": "draft"}},
            {"name": "review", "kind": "sim", "input": {"job": "review"}, "after": ["draft"]},
            {"name": "publish", "kind": "slow", "input": {"job": "publish"}, "after": ["review"]},
        ]
    }
    sent = await dash.http.post("/v1/jobs", json=body)
    assert sent.status_code == 202, sent.text
    job_id = sent.json()["id"]

    async def publishing() -> bool:
        job = (await dash.http.get(f"/v1/jobs/{job_id}")).json()
        return [s["status"] for s in job["steps"]][:2] == ["succeeded", "succeeded"]

    await eventually(publishing)
    watched = await open_page(dash.url)
    page = watched.page
    await page.click(f'#jobs-rows tr[data-job-id="{job_id}"] button')
    await page.wait_for_selector(f'#job-title:has-text("{job_id}")')
    job = (await dash.http.get(f"/v1/jobs/{job_id}")).json()
    steps = await page.locator("#job-steps > li").evaluate_all(
        "items => items.map(i => [i.dataset.step, i.dataset.status])"
    )
    assert steps == [[s["name"], s["status"]] for s in job["steps"]]
    assert steps[:2] == [["draft", "succeeded"], ["review", "succeeded"]]
    assert "after review" in await page.inner_text('#job-steps > li[data-step="publish"]')
    # A step's task opens in the task view.
    draft_task = job["steps"][0]["tasks"][0]["id"]
    await page.click(f'#job-steps button[data-task-id="{draft_task}"]')
    await page.wait_for_selector(f'#task-title:has-text("{draft_task}")')
    await page.locator("section", has=page.locator("#jobs-title")).screenshot(
        path=str(screenshots / "dashboard-jobs.png")
    )
    assert watched.errors == []
