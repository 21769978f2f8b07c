"""The simulated provider over real HTTP on loopback: what floodway's http adapter relies on."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from pydantic import ValidationError

from floodway.providers.sim import (
    RunningSimulator,
    SimulatorConfig,
    running_simulator,
    serve_app,
)
from floodway.providers.sim.window import RateWindow

FAST: dict[str, Any] = {"latency_ms": 5, "latency_jitter": 0.0, "seed": 7}


@asynccontextmanager
async def provider(**overrides: Any) -> AsyncIterator[tuple[RunningSimulator, httpx.AsyncClient]]:
    config = SimulatorConfig(**{**FAST, **overrides})
    async with (
        running_simulator(config) as sim,
        httpx.AsyncClient(base_url=sim.url, timeout=10) as client,
    ):
        yield sim, client


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for the in-process server to reach a state; bounded, so a bug fails, not hangs."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


async def finished(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """Poll a job until it leaves "running", as a client of an async provider would."""
    for _ in range(1000):
        body: dict[str, Any] = (await client.get(f"/jobs/{job_id}")).json()
        if body["status"] != "running":
            return body
        await asyncio.sleep(0.005)
    raise AssertionError(f"job {job_id} never finished")


async def ledger(client: httpx.AsyncClient) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get("/ledger")).json()
    return body


# -- sync requests ----------------------------------------------------------------------------


async def test_sync_success_returns_result_and_usage() -> None:
    async with provider() as (_sim, client):
        given = await client.post("/generate", json={"prompt": "a cat", "tokens": 42})
        estimated = await client.post("/generate", json={"prompt": "abcd"})
        polled = await client.get(f"/jobs/{given.json()['id']}")
        charged = await ledger(client)

    assert given.status_code == 200
    body = given.json()
    assert body["status"] == "succeeded"
    assert body["result"] == {
        "url": f"https://sim.invalid/img/{body['id']}.png",
        "echo": {"prompt": "a cat", "tokens": 42},
    }
    assert body["usage"] == {"tokens": 42}
    # Without "tokens", about 4 characters of compact JSON per token.
    assert estimated.json()["usage"] == {"tokens": len('{"prompt":"abcd"}') // 4}
    assert polled.json() == body
    tokens = 42 + len('{"prompt":"abcd"}') // 4  # the usage each answer reported, billed
    assert charged == {
        "charges": {"anon-1": 1, "anon-2": 1},
        "total": 2,
        "tokens": tokens,
        "double_charged": [],
    }


async def test_idempotent_replay_returns_the_same_job_and_is_charged_once() -> None:
    async with provider() as (sim, client):
        headers = {"Idempotency-Key": "img-1"}
        first = await client.post("/generate", json={"prompt": "x"}, headers=headers)
        again = await client.post("/generate", json={"prompt": "x"}, headers=headers)
        charged = await ledger(client)

    assert first.status_code == again.status_code == 200
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert charged == {
        "charges": {"img-1": 1},
        "total": 1,
        "tokens": first.json()["usage"]["tokens"],
        "double_charged": [],
    }
    assert sim.state.stats.replays == 1
    assert sim.state.stats.peak_concurrency == 1  # the replay did no work


async def test_key_in_flight_conflicts_and_an_unbilled_failure_frees_the_key() -> None:
    async with provider(hang_s=30) as (sim, client):
        headers = {"Idempotency-Key": "k"}
        hung = asyncio.create_task(
            client.post("/generate", json={"fail": "timeout"}, headers=headers)
        )
        await until(lambda: sim.state.stats.in_flight == 1, "the first request is in flight")
        conflict = await client.post("/generate", json={}, headers=headers)
        sim.state.begin_shutdown()  # releases the hung request
        timed_out = await hung
        retried = await client.post("/generate", json={}, headers=headers)
        charged = await ledger(client)

    assert conflict.status_code == 409
    assert conflict.json() == {
        "error": {"type": "conflict", "message": "request with this key in progress"}
    }
    assert timed_out.status_code == 504
    assert timed_out.json()["error"]["type"] == "timeout"
    assert retried.status_code == 200
    assert "idempotent-replayed" not in retried.headers
    assert charged["charges"] == {"k": 1}


async def test_provider_that_ignores_keys_shows_double_charges() -> None:
    async with provider(honor_idempotency_key=False) as (_sim, client):
        for _ in range(2):
            response = await client.post("/generate", json={}, headers={"Idempotency-Key": "k"})
            assert response.status_code == 200
        lookup = await client.get("/jobs", params={"idempotency_key": "k"})
        charged = await ledger(client)

    assert (charged["charges"], charged["total"], charged["double_charged"]) == (
        {"k": 2},
        2,
        ["k"],
    )
    assert lookup.status_code == 404


# -- limits -----------------------------------------------------------------------------------


async def test_concurrency_cap_answers_429_with_retry_after() -> None:
    async with provider(max_concurrency=3, hang_s=30) as (sim, client):
        hung = [
            asyncio.create_task(client.post("/generate", json={"fail": "timeout"}))
            for _ in range(3)
        ]
        await until(lambda: sim.state.stats.in_flight == 3, "three requests hold the cap")
        refused = await client.post("/generate", json={})
        sim.state.begin_shutdown()
        released = await asyncio.gather(*hung)
        charged = await ledger(client)

    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json() == {"error": {"type": "rate_limited", "message": "concurrency limit"}}
    assert [r.status_code for r in released] == [504, 504, 504]
    assert sim.state.stats.peak_concurrency == 3
    assert sim.state.stats.rate_limited == 1
    assert charged["total"] == 0


async def test_concurrency_burst_never_exceeds_the_cap() -> None:
    async with provider(max_concurrency=4, latency_ms=20) as (sim, client):
        responses = await asyncio.gather(
            *(client.post("/generate", json={"i": i}) for i in range(30))
        )
        charged = await ledger(client)

    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}
    assert sim.state.stats.peak_concurrency <= 4
    assert charged["total"] == statuses.count(200)
    assert sim.state.stats.rate_limited == statuses.count(429)


async def test_requests_per_minute_window_answers_429_with_retry_after() -> None:
    async with provider(rpm=2) as (_sim, client):
        responses = [await client.post("/generate", json={}) for _ in range(3)]
        stats = (await client.get("/stats")).json()
        charged = await ledger(client)

    ok1, ok2, refused = responses
    assert (ok1.status_code, ok2.status_code) == (200, 200)
    assert ok1.headers["x-ratelimit-remaining-requests"] == "1"
    assert ok2.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.json()["error"] == {
        "type": "rate_limited",
        "message": "requests per minute limit",
    }
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    assert "x-ratelimit-limit-tokens" not in refused.headers  # tokens are not limited
    # The control endpoints carry the headers too.
    assert stats["rate_limited"] == 1
    assert charged["total"] == 2


def test_window_admits_again_when_enough_of_the_minute_has_passed() -> None:
    window = RateWindow(rpm=3, tpm=100)
    window.record(60, now=0.0)
    window.record(30, now=10.0)

    assert window.wait_for(5, now=20.0) is None
    # 20 more tokens fit only once the 60 recorded at t=0 leave the window, at t=60.
    assert window.wait_for(20, now=20.0) == (40.0, "tokens per minute limit")
    window.record(5, now=20.0)
    assert window.wait_for(0, now=30.0) == (30.0, "requests per minute limit")
    assert dict(window.headers(now=30.0)) == {
        b"x-ratelimit-limit-requests": b"3",
        b"x-ratelimit-remaining-requests": b"0",
        b"x-ratelimit-reset-requests": b"50s",
        b"x-ratelimit-limit-tokens": b"100",
        b"x-ratelimit-remaining-tokens": b"5",
        b"x-ratelimit-reset-tokens": b"50s",
    }
    assert window.wait_for(0, now=60.0) is None


def test_a_request_bucket_answers_the_exact_wait() -> None:
    window = RateWindow(rpm=60, tpm=0, rpm_burst=2)  # 1 a second, 2 at once
    assert window.exact
    window.record(0, now=0.0)
    window.record(0, now=0.0)
    assert window.wait_for(0, now=0.25) == (pytest.approx(0.75), "requests per minute limit")
    assert dict(window.headers(now=0.25)) == {
        b"x-ratelimit-limit-requests": b"60",
        b"x-ratelimit-remaining-requests": b"0",  # what the bucket holds, whole
        b"x-ratelimit-reset-requests": b"1.75s",
    }
    assert window.wait_for(0, now=1.0) is None
    window.record(0, now=1.0)
    assert window.wait_for(0, now=1.5) == (pytest.approx(0.5), "requests per minute limit")


async def test_a_request_bucket_provider_sends_retry_after_ms_and_can_hide_its_headers() -> None:
    async with provider(rpm=60, rpm_burst=1, rate_headers=False) as (_sim, client):
        ok = await client.post("/generate", json={})
        refused = await client.post("/generate", json={})
    assert ok.status_code == 200 and refused.status_code == 429
    assert "x-ratelimit-limit-requests" not in ok.headers
    millis = int(refused.headers["retry-after-ms"])
    assert 0 < millis <= 1000
    assert refused.headers["retry-after"] == "1"  # whole seconds, rounded up


async def test_tokens_per_minute_window() -> None:
    async with provider(tpm=100) as (_sim, client):
        first = await client.post("/generate", json={"tokens": 60})
        over = await client.post("/generate", json={"tokens": 60})
        fits = await client.post("/generate", json={"tokens": 40})
        never = await client.post("/generate", json={"tokens": 101})

    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining-tokens"] == "40"
    assert over.status_code == 429
    assert over.json()["error"]["message"] == "tokens per minute limit"
    assert int(over.headers["retry-after"]) >= 1
    assert fits.status_code == 200
    assert fits.headers["x-ratelimit-remaining-tokens"] == "0"
    # Larger than a whole minute's quota: a 429 would be retried forever.
    assert never.status_code == 400
    assert never.json()["error"]["type"] == "request_too_large"


# -- misbehaviour -----------------------------------------------------------------------------


async def test_forced_failures_are_answered_and_not_charged() -> None:
    async with provider() as (sim, client):
        refusal = await client.post("/generate", json={"fail": "refusal"})
        server_error = await client.post("/generate", json={"fail": "5xx"})
        throttled = await client.post("/generate", json={"fail": "429"})
        charged = await ledger(client)

    assert refusal.status_code == 400
    assert refusal.json()["error"]["type"] == "content_policy"
    assert refusal.json()["error"]["message"]
    assert server_error.status_code == 503
    assert server_error.json()["error"]["type"] == "server_error"
    assert throttled.status_code == 429
    assert throttled.headers["retry-after"] == "1"
    assert charged["total"] == 0
    stats = sim.state.stats
    assert (stats.refusals, stats.errors_5xx, stats.rate_limited) == (1, 1, 1)


async def test_malformed_answer_is_a_charged_200_without_result() -> None:
    async with provider() as (sim, client):
        response = await client.post("/generate", json={"prompt": "x"})
        malformed = await client.post("/generate", json={"prompt": "x", "fail": "malformed"})
        charged = await ledger(client)

    assert response.json()["result"] is not None
    assert malformed.status_code == 200
    assert malformed.json()["result"] is None
    assert "garbage" in malformed.json()
    assert charged["total"] == 2
    assert sim.state.stats.malformed == 1


async def test_configured_rates_drive_the_outcome() -> None:
    async with provider(error_rate=1.0) as (_sim, failing_client):
        failing = await failing_client.post("/generate", json={})
    async with provider(rate_limit_rate=1.0) as (_sim, throttled_client):
        throttled = await throttled_client.post("/generate", json={})

    assert failing.status_code == 503
    assert throttled.status_code == 429
    assert "retry-after" in throttled.headers


async def test_bad_requests_get_json_errors_and_change_nothing() -> None:
    async with provider() as (_sim, client):
        answers = [
            await client.post("/generate", content=b"not json"),
            await client.post("/generate", json=[1, 2]),
            await client.post("/generate", json={"tokens": "many"}),
            await client.post("/generate", json={"tokens": -1}),
            await client.post("/generate", json={"fail": "sometimes"}),
            await client.post("/generate", json={"callback_url": "ftp://x"}),
        ]
        unknown_job = await client.get("/jobs/nope")
        no_key = await client.get("/jobs")
        unknown_route = await client.get("/nowhere")
        charged = await ledger(client)

    assert [a.status_code for a in answers] == [400] * len(answers)
    assert {a.json()["error"]["type"] for a in answers} == {"invalid_request"}
    assert unknown_job.status_code == 404
    assert unknown_job.json()["error"]["type"] == "not_found"
    assert no_key.status_code == 400
    assert unknown_route.status_code == 404
    assert unknown_route.json()["error"]["type"] == "not_found"
    assert charged["total"] == 0


# -- async jobs -------------------------------------------------------------------------------


async def test_async_job_is_accepted_then_polled_to_success() -> None:
    async with provider(async_jobs=True, job_duration_ms=20) as (sim, client):
        headers = {"Idempotency-Key": "video-1"}
        accepted = await client.post("/generate", json={"prompt": "v"}, headers=headers)
        job_id = accepted.json()["id"]
        done = await finished(client, job_id)
        replay = await client.post("/generate", json={"prompt": "v"}, headers=headers)
        by_key = await client.get("/jobs", params={"idempotency_key": "video-1"})
        unknown_key = await client.get("/jobs", params={"idempotency_key": "other"})
        charged = await ledger(client)

    assert accepted.status_code == 202
    assert accepted.json() == {"id": job_id, "status": "running"}
    assert done["status"] == "succeeded"
    assert done["result"]["url"] == f"https://sim.invalid/img/{job_id}.png"
    assert done["usage"] == {"tokens": len('{"prompt":"v"}') // 4}
    assert replay.status_code == 200
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.json()["id"] == job_id
    assert by_key.status_code == 200
    assert by_key.json() == done
    assert unknown_key.status_code == 404
    assert charged == {
        "charges": {"video-1": 1},
        "total": 1,
        "tokens": done["usage"]["tokens"],
        "double_charged": [],
    }
    stats = sim.state.stats
    assert stats.jobs_submitted == 1
    assert stats.polls >= 1
    assert (stats.in_flight, stats.peak_concurrency) == (0, 1)


async def test_failed_async_job_is_refunded_and_its_key_can_run_again() -> None:
    async with provider(async_jobs=True, job_duration_ms=5) as (_sim, client):
        headers = {"Idempotency-Key": "k"}
        doomed = await client.post("/generate", json={"fail": "5xx"}, headers=headers)
        failed = await finished(client, doomed.json()["id"])
        after_failure = await ledger(client)
        again = await client.post("/generate", json={}, headers=headers)
        succeeded = await finished(client, again.json()["id"])
        charged = await ledger(client)

    assert doomed.status_code == 202
    assert failed["status"] == "failed"
    assert failed["error"]["type"] == "server_error"
    assert after_failure["total"] == 0
    assert again.status_code == 202
    assert again.json()["id"] != doomed.json()["id"]
    assert succeeded["status"] == "succeeded"
    assert charged["charges"] == {"k": 1}


async def test_async_refusal_is_answered_at_submit() -> None:
    async with provider(async_jobs=True) as (sim, client):
        refused = await client.post("/generate", json={"fail": "refusal"})

    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "content_policy"
    assert sim.state.stats.jobs_submitted == 0
    assert sim.state.ledger.total == 0


async def test_cancel_a_running_job() -> None:
    async with provider(async_jobs=True, job_duration_ms=60_000, max_concurrency=5) as (
        sim,
        client,
    ):
        job_id = (await client.post("/generate", json={})).json()["id"]
        # A second job stays running: shutting down must stop it cleanly.
        await client.post("/generate", json={})
        cancelled = await client.delete(f"/jobs/{job_id}")
        polled = await client.get(f"/jobs/{job_id}")
        twice = await client.delete(f"/jobs/{job_id}")
        unknown = await client.delete("/jobs/nope")
        in_flight = sim.state.stats.in_flight

    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert polled.json()["status"] == "cancelled"
    assert twice.status_code == 409
    assert unknown.status_code == 404
    assert in_flight == 1
    assert sim.state.stats.peak_concurrency == 2
    assert sim.state.stats.cancelled == 1


# -- webhooks ---------------------------------------------------------------------------------


@asynccontextmanager
async def receiver() -> AsyncIterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """A callback endpoint on loopback; yields its URL and what it received."""
    received: list[tuple[dict[str, str], bytes]] = []
    app = FastAPI()

    @app.post("/hook")
    async def hook(request: Request) -> Response:
        received.append((dict(request.headers), await request.body()))
        return Response(status_code=204)

    async with serve_app(app) as url:
        yield f"{url}/hook", received


def expected_signature(secret: str, headers: dict[str, str], body: bytes) -> str:
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    return (
        "v1,"
        + base64.b64encode(hmac.new(secret.encode(), signed, hashlib.sha256).digest()).decode()
    )


async def test_webhook_is_delivered_with_a_valid_signature() -> None:
    async with (
        receiver() as (hook_url, received),
        provider(async_jobs=True, job_duration_ms=5, webhook=True) as (sim, client),
    ):
        accepted = await client.post("/generate", json={"callback_url": hook_url, "p": 1})
        await until(lambda: sim.state.stats.webhooks_sent == 1, "the callback was delivered")

    assert len(received) == 1
    headers, body = received[0]
    job_id = accepted.json()["id"]
    assert headers["webhook-id"] == job_id
    assert headers["webhook-signature"] == expected_signature("sim-secret", headers, body)
    assert int(headers["webhook-timestamp"]) > 0
    payload = json.loads(body)
    assert payload["id"] == job_id
    assert payload["status"] == "succeeded"
    assert payload["result"]["echo"] == {"callback_url": hook_url, "p": 1}
    assert set(payload) >= {"id", "status", "result", "usage"}


async def test_webhook_drop_rate_one_sends_nothing() -> None:
    async with (
        receiver() as (hook_url, received),
        provider(async_jobs=True, job_duration_ms=5, webhook=True, webhook_drop_rate=1.0) as (
            sim,
            client,
        ),
    ):
        accepted = [
            await client.post("/generate", json={"callback_url": hook_url}) for _ in range(3)
        ]
        for response in accepted:
            assert (await finished(client, response.json()["id"]))["status"] == "succeeded"

    assert received == []
    assert sim.state.stats.webhooks_dropped == 3
    assert sim.state.stats.webhooks_sent == 0


# -- control and configuration ----------------------------------------------------------------


async def test_reset_clears_ledger_and_stats() -> None:
    async with provider() as (_sim, client):
        await client.post("/generate", json={}, headers={"Idempotency-Key": "k"})
        reset = await client.post("/reset")
        charged = await ledger(client)
        stats = (await client.get("/stats")).json()
        lookup = await client.get("/jobs", params={"idempotency_key": "k"})

    assert reset.status_code == 200
    assert charged == {"charges": {}, "total": 0, "tokens": 0, "double_charged": []}
    assert stats["requests"] == 0
    assert stats["peak_concurrency"] == 0
    assert lookup.status_code == 404


async def test_same_seed_gives_the_same_behaviour() -> None:
    async def run() -> list[tuple[int, str]]:
        async with provider(seed=11, error_rate=0.3, refusal_rate=0.2) as (_sim, client):
            answers = [await client.post("/generate", json={}) for _ in range(12)]
        return [(a.status_code, a.json().get("id", "")) for a in answers]

    first, second = await run(), await run()
    assert first == second
    assert {status for status, _ in first} == {200, 400, 503}


@pytest.mark.parametrize(
    "bad",
    [
        {"latency_ms": -1},
        {"rpm": -5},
        {"max_concurrency": -1},
        {"error_rate": 1.5},
        {"webhook_drop_rate": -0.1},
        {"error_rate": 0.6, "refusal_rate": 0.6},
        {"webhook": True},
        {"rpm_burst": 5},  # a bucket of nothing: rpm is required
        {"surprise": 1},
    ],
)
def test_config_rejects_impossible_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SimulatorConfig(**bad)


async def test_taken_port_raises_instead_of_exiting() -> None:
    async with running_simulator(SimulatorConfig(**FAST)) as sim:
        port = int(sim.url.rsplit(":", 1)[1])
        with pytest.raises(OSError):
            async with running_simulator(SimulatorConfig(**FAST), port=port):
                pass
