"""The dashboard at ``/`` in a real browser (Debian's Chromium) against a real API server."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import (
    TERMINAL,
    Dash,
    StartDash,
    Watched,
    eventually,
)

OpenPage = Any  # the open_page fixture: (url, *, wait_for=...) -> Watched

HIDE = """() => {
    Object.defineProperty(document, "visibilityState", {configurable: true, get: () => "hidden"});
    Object.defineProperty(document, "hidden", {configurable: true, get: () => true});
    document.dispatchEvent(new Event("visibilitychange"));
}"""
SHOW = """() => {
    Object.defineProperty(document, "visibilityState", {configurable: true, get: () => "visible"});
    Object.defineProperty(document, "hidden", {configurable: true, get: () => false});
    document.dispatchEvent(new Event("visibilitychange"));
}"""


def seconds(text: str) -> float:
    """The page's duration format back to seconds ("31 ms", "1.25 s", "2.5 min")."""
    found = re.fullmatch(r"<?([\d.]+) (ms|s|min|h)", text.strip())
    assert found, text
    scale = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}[found.group(2)]
    return float(found.group(1)) * scale


async def phase(page: Any) -> str:
    return str(await page.get_attribute("#conn-status", "data-phase"))


async def page_eventually(page: Any, js: str, timeout: float = 20.0) -> None:
    # A function, not a bare expression: the page's CSP forbids eval, which Playwright uses
    # for the latter.
    await page.wait_for_function(f"() => {js}", timeout=timeout * 1000)


async def test_page_loads_without_errors_or_outside_requests(
    dash: Dash, open_page: OpenPage
) -> None:
    watched: Watched = await open_page(dash.url)
    page = watched.page
    await page.wait_for_selector("#dead-rows tr")
    await page.wait_for_selector("#version:not(:empty)")
    assert await page.title() == "floodway dashboard"
    # The stylesheet and the module scripts came from the server, not a fallback page.
    assert await page.evaluate("getComputedStyle(document.querySelector('main')).display") == (
        "grid"
    )
    assert watched.errors == []
    outside = [u for u in watched.requests if not u.startswith(dash.url + "/")]
    assert outside == []
    for path in ("/static/app.js", "/static/style.css", "/v1/stats", "/v1/tasks"):
        assert watched.count(path) >= 1, path


async def test_the_numbers_on_the_page_match_v1_stats(dash: Dash, open_page: OpenPage) -> None:
    watched = await open_page(dash.url)
    page = watched.page
    stats = await dash.stats()
    # Every state has tasks, and the fixture holds them still.
    assert {s for s, n in stats["tasks"].items() if n} >= {
        "queued",
        "running",
        "retrying",
        "succeeded",
        "failed",
        "dead",
        "timeout",
        "cancelled",
    }
    await page.wait_for_selector(f'#dead-count[data-value="{stats["dead_letters"]}"]')
    for status, count in stats["tasks"].items():
        cell = page.locator(f'.state-count[data-status="{status}"]')
        assert await cell.get_attribute("data-value") == str(count), status
        assert (await cell.inner_text()).replace(",", "") == str(count), status
    total = sum(stats["tasks"].values())
    assert await page.get_attribute("#states-total", "data-value") == str(total)
    assert await page.inner_text("#dead-count") == str(stats["dead_letters"])
    rows = await page.locator("#dead-rows tr").evaluate_all(
        "rows => rows.map(r => r.dataset.taskId)"
    )
    assert sorted(rows) == sorted(dash.ids["dead"])

    slow = stats["resources"]["slow-api"]
    card = page.locator('[data-resource="slow-api"]')
    assert await card.get_attribute("data-in-flight") == str(slow["in_flight"]) == "1"
    assert await card.get_attribute("data-concurrency") == str(slow["concurrency"]) == "1"
    assert "1 of 1" in await card.inner_text()
    # Each limit in force with its source, and what holds the queue back.
    limit = card.locator('.limits li[data-dimension="concurrency"]')
    assert slow["limits"]["concurrency"]["source"] == "configured"
    assert await limit.get_attribute("data-source") == "configured"
    assert "In flight" in await limit.inner_text() and "configured" in await limit.inner_text()
    if slow["held_back_by"].get("concurrency"):
        # What admission held back at its last pass: the page may have drawn the poll before
        # the one read here, so it shows it by its next.
        held = card.locator(".held-back")
        await held.wait_for(timeout=10_000)
        assert (await held.inner_text()).startswith("Held back by the in-flight limit")

    # Latency figures: the same numbers, in the page's units.
    p95 = await page.inner_text('[data-metric="completion_p95"]')
    assert seconds(p95) == pytest.approx(stats["completion"]["p95_s"], rel=0.01, abs=0.001)
    wait = await page.inner_text('[data-metric="queue_wait_p95"]')
    assert seconds(wait) == pytest.approx(stats["queue_wait"]["p95_s"], rel=0.01, abs=0.001)


async def test_retrying_a_dead_letter_from_the_page(dash: Dash, open_page: OpenPage) -> None:
    watched = await open_page(dash.url)
    page = watched.page
    task_id = dash.ids["dead"][0]
    dash.flip.error_rate = 0.0  # the provider has recovered
    await page.click(f'button[data-retry="{task_id}"]')
    await page.wait_for_selector(f'#dead-message:has-text("Task {task_id} is queued again")')
    await dash.settle([task_id], {"succeeded"})
    assert await dash.status(task_id) == "succeeded"
    # The row goes, and the count follows the next poll.
    await page.wait_for_selector(f'#dead-rows tr[data-task-id="{task_id}"]', state="detached")
    await page.wait_for_selector('#dead-count[data-value="2"]')
    assert watched.errors == []


async def test_retry_all_dead_letters(dash: Dash, open_page: OpenPage) -> None:
    watched = await open_page(dash.url)
    page = watched.page
    await page.wait_for_selector("#dead-rows tr")
    dash.flip.error_rate = 0.0
    await page.click("#retry-all")
    question = page.locator("#retry-all-question")
    await question.wait_for()
    assert "3 dead letters" in await question.inner_text()
    await page.click("#retry-all-yes")
    await page.wait_for_selector('#dead-message:has-text("Retried 3 of 3")')
    await dash.settle(dash.ids["dead"], {"succeeded"})
    await page.wait_for_selector("#dead-empty:visible")
    await page.wait_for_selector('#dead-count[data-value="0"]')
    assert await page.is_disabled("#retry-all")
    assert watched.errors == []


async def test_polling_pauses_while_the_tab_is_hidden(dash: Dash, open_page: OpenPage) -> None:
    watched = await open_page(f"{dash.url}/?poll=300")
    page = watched.page

    async def polled(n: int) -> bool:
        return watched.count("/v1/stats") >= n

    await eventually(lambda: polled(3))
    assert await phase(page) == "live"

    await page.evaluate(HIDE)
    await page_eventually(page, "document.querySelector('#conn-status').dataset.phase === 'paused'")
    await asyncio.sleep(0.5)  # a round already under way may still land
    before = watched.count("/v1/stats")
    await asyncio.sleep(2.0)  # six intervals
    assert watched.count("/v1/stats") == before
    assert await page.inner_text("#conn-text") == "Paused while this tab is hidden"

    await page.evaluate(SHOW)
    await eventually(lambda: polled(before + 1), timeout=2.0)  # at once, not after an interval
    await eventually(lambda: polled(before + 3), timeout=5.0)  # and then on the interval
    assert await phase(page) == "live"
    assert watched.errors == []


async def test_errors_back_off_with_full_jitter_and_recover(
    dash: Dash, open_page: OpenPage
) -> None:
    watched = await open_page(f"{dash.url}/?poll=300")
    page = watched.page
    # The delay rule itself: below min(cap, base * 2^(n-1)), never above the cap.
    bounds = await page.evaluate(
        """async () => {
        const {backoffDelay} = await import("./static/poller.js");
        const top = () => 0.999999, bottom = () => 0;
        return [1, 2, 3, 4, 5, 6, 7, 12, 80].map(n => [
            n, backoffDelay(n, {random: top}), backoffDelay(n, {random: bottom})]);
    }"""
    )
    for n, high, low in bounds:
        assert low == 0
        assert high == pytest.approx(min(30000, 1000 * 2 ** (n - 1)), abs=1), n

    async def unavailable(route: Any) -> None:
        await route.fulfill(
            status=503,
            content_type="application/problem+json",
            body='{"type":"about:blank","title":"unavailable","status":503,"detail":"down"}',
        )

    await page.route("**/v1/stats", unavailable)
    await page_eventually(page, "window.floodwayDashboard.poller.failures >= 2", timeout=10.0)
    assert await phase(page) == "backoff"
    assert "API error 503" in await page.inner_text("#conn-text")
    await page.unroute("**/v1/stats", unavailable)
    await page.evaluate("window.floodwayDashboard.poller.kick()")
    await page_eventually(page, "document.querySelector('#conn-status').dataset.phase === 'live'")
    assert await page.evaluate("window.floodwayDashboard.poller.failures") == 0
    # The 503s were logged by the browser; nothing else went wrong.
    assert [e for e in watched.errors if "503" not in e] == []


async def test_an_api_key_is_asked_for_stored_and_sent(
    start_dash: StartDash, open_page: OpenPage
) -> None:
    dash = await start_dash(keys={"key-a": "tenant-a"})
    watched = await open_page(dash.url, wait_for="#auth-message:visible")
    page = watched.page
    assert "needs an API key" in await page.inner_text("#auth-message")
    assert await phase(page) == "blocked"
    assert await page.get_attribute("#api-key", "aria-invalid") == "true"

    await page.fill("#api-key", "wrong")
    await page.click('#key-form button[type="submit"]')
    await page.wait_for_selector('#auth-message:has-text("was refused")')

    sent: list[str | None] = []
    page.on(
        "request",
        lambda r: sent.append(r.headers.get("authorization")) if "/v1/" in r.url else None,
    )
    await page.fill("#api-key", "key-a")
    await page.click('#key-form button[type="submit"]')
    stats = await dash.stats()
    await page.wait_for_selector(
        f'.state-count[data-status="succeeded"][data-value="{stats["tasks"]["succeeded"]}"]'
    )
    await page.wait_for_selector("#auth-message", state="hidden")
    await page.wait_for_selector("#dead-rows tr")
    assert sent and all(h == "Bearer key-a" for h in sent)
    assert await page.evaluate("localStorage.getItem('floodway.apiKey')") == "key-a"

    # The key survives a reload: no prompt the second time.
    await page.reload()
    await page.wait_for_selector('.state-count[data-status="succeeded"][data-value]')
    assert await page.is_hidden("#auth-message")
    assert await phase(page) == "live"


async def test_task_search_shows_the_task_and_follows_its_events(
    dash: Dash, open_page: OpenPage
) -> None:
    watched = await open_page(dash.url)
    page = watched.page
    done = dash.ids["succeeded"][0]
    await page.fill("#task-id", done)
    await page.press("#task-id", "Enter")
    await page.wait_for_selector('#events-state:has-text("ended (succeeded)")')
    assert await page.inner_text("#task-title") == done
    assert await page.inner_text("#task-status") == "succeeded"
    events = await page.locator("#task-events li").evaluate_all(
        "items => items.map(i => i.dataset.status)"
    )
    assert events == ["queued", "running", "succeeded"]

    # A task still waiting: the history grows live as it changes.
    waiting = dash.ids["queued"][0]
    await page.fill("#task-id", waiting)
    await page.click('#search-form button[type="submit"]')
    await page.wait_for_selector('#task-events li[data-status="queued"]')
    assert "following live" in await page.inner_text("#events-state")
    assert (await dash.http.delete(f"/v1/tasks/{waiting}")).status_code == 200
    await page.wait_for_selector('#task-events li[data-status="cancelled"]')
    await page.wait_for_selector('#events-state:has-text("ended (cancelled)")')
    assert await page.inner_text("#task-status") == "cancelled"

    await page.fill("#task-id", "t_nope")
    await page.press("#task-id", "Enter")
    await page.wait_for_selector('#task-message:has-text("No task t_nope")')
    # The 404 of the lookup is the browser's only complaint.
    assert [e for e in watched.errors if "404" not in e] == []


async def test_api_serves_the_assets(dash: Dash) -> None:
    """The page and every file it loads come from the app: ``/`` and ``/static/``."""
    home = await dash.http.get("/")
    assert home.status_code == 200 and 'src="static/app.js"' in home.text
    for name in (
        "app.js",
        "api.js",
        "poller.js",
        "chart.js",
        "series.js",
        "events.js",
        "format.js",
        "views.js",
    ):
        response = await dash.http.get(f"/static/{name}")
        assert response.status_code == 200, name
        assert "javascript" in response.headers["content-type"], name
    assert (await dash.http.get("/static/style.css")).headers["content-type"].startswith("text/css")
    assert (await dash.http.get("/static/favicon.svg")).status_code == 200


async def test_screenshot(dash: Dash, open_page: OpenPage, screenshots: Path) -> None:
    """A picture of the dashboard with history in its charts, for people to look at (kept in
    docs/screenshots/, which the README shows)."""
    watched = await open_page(f"{dash.url}/?poll=400")
    page = watched.page
    # Some traffic while the page watches, so the charts have a shape.
    for burst in range(4):
        ids = [await dash.submit("sim", {"burst": burst, "n": n}) for n in range(6 + 4 * burst)]
        await dash.settle(ids, TERMINAL)
        await asyncio.sleep(0.5)
    await page_eventually(page, "window.floodwayDashboard.history.samples.length >= 8")
    await page.fill("#task-id", dash.ids["dead"][0])
    await page.press("#task-id", "Enter")
    await page.wait_for_selector('#events-state:has-text("ended (dead)")')
    path = screenshots / "dashboard.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    assert watched.errors == []


async def test_upstream_429_and_5xx_rates_from_an_upstream_section(
    dash: Dash, open_page: OpenPage
) -> None:
    """The page charts the ``upstream`` counters of /v1/stats as rates: per minute, and as a
    share of calls (the counters are replaced, from the first poll on, by known values)."""
    polls = 0

    async def with_upstream(route: Any) -> None:
        nonlocal polls
        polls += 1
        response = await route.fetch()
        body = await response.json()
        body["upstream"] = {"calls": 60 * polls, "throttled": 3 * polls, "server_errors": 6 * polls}
        await route.fulfill(response=response, json=body)

    watched = await open_page(
        f"{dash.url}/?poll=300", wait_for=None, routes={"**/v1/stats": with_upstream}
    )
    page = watched.page
    # Once the steps from the server's recent samples (real counters) to the first of these
    # have left the rates' smoothing window, the shares are these counters' alone.
    await page.wait_for_selector('[data-metric="throttled_per_min"]:has-text("(5.0 % of calls)")')
    await page.wait_for_selector(
        '[data-metric="server_errors_per_min"]:has-text("(10.0 % of calls)")'
    )
    assert await page.is_hidden("#errors-note")
    await page.unroute_all(behavior="ignoreErrors")
    assert watched.errors == []


async def test_api_docs_render_with_the_network_off(
    dash: Dash, open_page: OpenPage, screenshots: Path
) -> None:
    """/docs on an air-gapped host: every request that leaves the server is aborted, and
    Swagger UI still renders the whole API from assets the server itself serves."""
    refused: list[str] = []

    async def loopback_only(route: Any) -> None:
        host = httpx.URL(route.request.url).host
        if host in ("127.0.0.1", "localhost", "::1"):
            await route.continue_()
        else:
            refused.append(route.request.url)
            await route.abort("internetdisconnected")

    watched = await open_page(
        f"{dash.url}/docs", wait_for=".swagger-ui .opblock", routes={"**/*": loopback_only}
    )
    page = watched.page
    await page.wait_for_selector('.opblock-summary-path[data-path="/v1/tasks"]')
    assert "floodway" in await page.inner_text(".swagger-ui .title")
    operations = await page.locator(".opblock").count()
    assert operations >= 10
    assert refused == [] and watched.errors == []
    path = screenshots / "api-docs.png"
    await page.screenshot(path=str(path), full_page=False)
    assert path.stat().st_size > 10_000


async def test_charts_open_with_the_servers_recent_history(dash: Dash, open_page: OpenPage) -> None:
    """Traffic before the page opens is on its charts at once: the page reads the server's
    recent samples of /v1/stats before its first poll (and polls once a minute here)."""
    for burst in range(3):
        ids = [await dash.submit("sim", {"before": burst, "n": n}) for n in range(5)]
        await dash.settle(ids, TERMINAL)
    history = dash.app.state.api.history

    async def sampled() -> bool:
        return len(history.samples()) >= 8

    await eventually(sampled)
    watched = await open_page(f"{dash.url}/?poll=60000")
    page = watched.page
    await page.wait_for_selector("#chart-throughput path.chart-line")
    drawn = await page.evaluate("window.floodwayDashboard.history.samples.length")
    assert drawn >= 8  # the server's samples, and the page's own first poll
    assert watched.count("/v1/stats/history") == 1 and watched.count("/v1/stats") == 1
    assert watched.errors == []


async def test_the_spend_panel_shows_the_spend_ledger(dash: Dash, open_page: OpenPage) -> None:
    view = (await dash.http.get("/v1/spend", params={"since": "24h"})).json()
    assert view["cost"] > 0 and view["saved"] > 0  # the fixture's priced calls and a dedupe
    watched = await open_page(dash.url)
    page = watched.page
    await page.wait_for_selector("#spend-rows tr[data-kind='chat']")
    shown = float(str(await page.get_attribute("#spend-cost", "data-value")))
    assert shown == pytest.approx(view["cost"])
    saved = float(str(await page.get_attribute("#spend-saved", "data-value")))
    assert saved == pytest.approx(view["saved"])
    (line,) = view["lines"]
    cells = await page.locator("#spend-rows tr[data-kind='chat'] td").all_inner_texts()
    assert cells[:2] == [line["tenant"], "chat"]
    assert cells[4:] == [str(line["calls"]), str(line["deduped"])]
    assert await page.is_hidden("#spend-empty")
    # A day of hourly bars; the hour of the fixture's calls holds all of it.
    bars = [
        float(v)
        for v in await page.eval_on_selector_all(
            "#spend-bars .spend-bar", "bars => bars.map(b => b.dataset.value)"
        )
    ]
    assert len(bars) == 24 and sum(bars) == pytest.approx(view["cost"])
    budget = page.locator("#budgets [data-tenant='default'] .meter")
    (answer,) = view["budgets"]
    label = str(await budget.get_attribute("aria-label"))
    assert label.startswith("Budget of default:") and "left of 1.00" in label
    assert int(str(await budget.get_attribute("aria-valuenow"))) == round(
        100 * (answer["spent"] + answer["held"]) / answer["amount"]
    )
    assert watched.errors == []
