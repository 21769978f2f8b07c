"""The API as a newcomer and a load balancer meet it: a body sent without its JSON header is
told which header to add, a body that never arrives is cut off, health and readiness report
each dependency, and /docs needs nothing from the internet."""

from __future__ import annotations

import asyncio
import re
import socket

from harness.processes import until
from tests.integration.conftest import ApiServer, StartApi

SUBMIT = b'{"kind": "sim", "input": {"prompt": "a red chair"}}'
AS_JSON = {"content-type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_a_body_not_sent_as_json_is_415_naming_the_header(api: ApiServer) -> None:
    http = await api.client()
    for headers in (
        {"content-type": "application/x-www-form-urlencoded"},  # curl -d
        {"content-type": "text/plain"},
        {},
    ):
        for path in ("/v1/tasks", "/v1/batches"):
            response = await http.post(path, content=SUBMIT, headers=headers)
            assert response.status_code == 415, (path, headers, response.text)
            problem = response.json()
            assert response.headers["content-type"] == "application/problem+json"
            assert problem["type"] == "urn:floodway:problem:unsupported-media-type"
            assert "Content-Type: application/json" in problem["detail"]
    assert (await http.get("/v1/tasks")).json()["items"] == []  # nothing was stored
    for media_type in ("application/json", "application/json; charset=utf-8"):
        ok = await http.post("/v1/tasks", content=SUBMIT, headers={"content-type": media_type})
        assert ok.status_code == 202, ok.text
    # An empty body is still a validation error that names the missing body.
    assert (await http.post("/v1/tasks")).status_code == 422


async def test_connections_that_send_headers_and_no_body_are_closed_with_408(
    start_api: StartApi,
) -> None:
    server = await start_api(api={"body_timeout": "0.5s"}, run_workers=False)
    host, port = server.url.removeprefix("http://").split(":")
    request = (
        f"POST /v1/tasks HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n"
    ).encode()

    async def stall() -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(request)
            await writer.drain()
            return await reader.read()  # until the server closes the connection
        finally:
            writer.close()

    async with asyncio.timeout(60):  # a guard against a hang, not a measurement
        answers = await asyncio.gather(*(stall() for _ in range(300)))
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"urn:floodway:problem:body-timeout" in answer
    # The server still serves.
    http = await server.client()
    assert (
        await http.post("/v1/tasks", content=SUBMIT, headers={"content-type": "application/json"})
    ).status_code == 202


async def test_healthz_is_liveness_and_readyz_reports_each_dependency(api: ApiServer) -> None:
    http = await api.client()
    health = await http.get("/healthz")
    assert health.status_code == 200 and health.json() == {
        "status": "ok",
        "version": health.json()["version"],
    }
    head = await http.head("/healthz")
    assert head.status_code == 200 and head.content == b""
    ready = await http.get("/readyz")
    assert ready.status_code == 200
    checks = ready.json()["checks"]
    assert set(checks) == {"ledger"} and checks["ledger"]["status"] == "ok"
    assert checks["ledger"]["latency_ms"] >= 0 and checks["ledger"]["target"].startswith("sqlite")
    verbose = await http.get("/healthz", params={"verbose": "1"})
    assert verbose.status_code == 200 and set(verbose.json()["checks"]) == {"ledger"}
    assert (await http.head("/readyz")).status_code == 200


async def test_an_unreachable_redis_makes_readyz_503_and_healthz_stays_200(
    start_api: StartApi,
) -> None:
    redis_url = f"redis://127.0.0.1:{free_port()}/0"
    server = await start_api(redis=redis_url, run_workers=False)
    http = await server.client()
    ready = await http.get("/readyz")
    assert ready.status_code == 503, ready.text
    problem = ready.json()
    assert problem["type"] == "urn:floodway:problem:dependency-unavailable"
    assert problem["checks"]["limiter"]["status"] == "down"
    assert problem["checks"]["limiter"]["target"] == redis_url
    assert problem["checks"]["ledger"]["status"] == "ok"
    assert redis_url in problem["detail"] and ready.headers["retry-after"] == "1"
    assert (await http.head("/readyz")).status_code == 503
    health = await http.get("/healthz?verbose")
    assert health.status_code == 200 and health.json()["checks"]["limiter"]["status"] == "down"
    assert (await http.get("/healthz")).status_code == 200
    # Submits are still taken (no submit rate needs Redis here): dispatch waits for it.
    submitted = await http.post(
        "/v1/tasks", content=SUBMIT, headers={"content-type": "application/json"}
    )
    assert submitted.status_code == 202


async def test_docs_assets_come_from_the_server(api: ApiServer) -> None:
    http = await api.client()
    page = (await http.get("/docs")).text
    assets = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets), page
    for asset in assets:
        assert asset.startswith("/"), asset  # on this server, never a CDN
        assert (await http.get(asset)).status_code == 200, asset
    assert "cdn" not in page.lower()


async def test_stats_history_holds_the_processes_recent_samples(api: ApiServer) -> None:
    http = await api.client()
    history = api.app.state.api.history

    async def sampled() -> bool:
        return len(history.samples()) >= 1

    await until(sampled, 10, "the first stats sample")
    answer = (await http.get("/v1/stats/history")).json()
    assert answer["interval_s"] == 5.0 and answer["samples"]
    first = answer["samples"][0]
    assert first["at"] <= answer["now"] and set(first["stats"]) >= {"tasks", "completion"}
