"""The http and simulated adapters against real HTTP servers on loopback: the simulator, and a
small provider whose answers the tests choose (408, HTTP-date Retry-After, odd bodies...)."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response

from floodway import ConfigError, FatalError, InvalidOutput, RetryableError
from floodway.clock import SystemClock
from floodway.config import KindConfig
from floodway.context import Context, RecordRef
from floodway.core.outcome import Parked
from floodway.core.states import Status
from floodway.core.task import Lane, Task
from floodway.kinds import KindRegistry, KindSpec
from floodway.providers.base import AdapterHandler
from floodway.providers.registry import aclose_kinds, build_provider_kind
from floodway.providers.sim import SimulatorConfig, running_simulator, serve_app
from floodway.providers.sim.server import RunningSimulator


class RefStore:
    """Where a Context records upstream refs in these tests."""

    def __init__(self) -> None:
        self.refs: dict[str, str] = {}

    def recorder(self, task_id: str) -> RecordRef:
        async def record(ref: str) -> bool:
            self.refs[task_id] = ref
            return True

        return record


def make_ctx(key: str = "key-1", ref: str | None = None, store: RefStore | None = None) -> Context:
    task = Task(
        id="t_1",
        kind="k",
        status=Status.RUNNING,
        lane=Lane.BACKGROUND,
        tenant="default",
        input={},
        fingerprint=key,
        lease_token="lease-1",
        upstream_ref=ref,
        started_at=time.time(),
    )
    return Context(task, SystemClock(), (store or RefStore()).recorder(task.id))


async def parked(call: Any) -> Parked:
    """What a handler that started an upstream job returns."""
    answer = await call
    assert isinstance(answer, Parked), answer
    return answer


def build(**cfg: Any) -> KindSpec:
    return build_provider_kind("k", KindConfig(**cfg))


async def close(*specs: KindSpec) -> None:
    for spec in specs:
        registry = KindRegistry()
        registry.add(spec)
        await aclose_kinds(registry)


@pytest.fixture
async def sim() -> AsyncIterator[RunningSimulator]:
    config = SimulatorConfig(latency_ms=5, latency_jitter=0, rpm=10_000, hang_s=5, seed=7)
    async with running_simulator(config) as running:
        yield running


@pytest.fixture
async def sim_async() -> AsyncIterator[RunningSimulator]:
    config = SimulatorConfig(async_jobs=True, job_duration_ms=200, latency_jitter=0, seed=7)
    async with running_simulator(config) as running:
        yield running


# -- the simulator, synchronous ------------------------------------------------------------------
async def test_success_returns_the_result_field_reports_usage_and_sends_the_key(
    sim: RunningSimulator,
) -> None:
    spec = build(adapter="simulated", url=sim.url)
    ctx = make_ctx("work-abc")
    result = await spec.handler(ctx, {"prompt": "a cat", "tokens": 42})
    await close(spec)
    assert result["echo"] == {"prompt": "a cat", "tokens": 42}
    assert ctx.usage == 42
    assert sim.state.ledger.charges == {"work-abc": 1}
    assert "x-ratelimit-remaining-requests" in ctx.response_headers
    assert spec.idempotent and spec.lookup is not None and spec.poll is not None
    assert spec.estimate({"tokens": 42}) == 42


async def test_the_same_key_replays_instead_of_billing_again(sim: RunningSimulator) -> None:
    lookup_url = f"{sim.url}/jobs?idempotency_key={{key}}"
    spec = build(adapter="http", url=f"{sim.url}/generate", lookup_url=lookup_url)
    first = await spec.handler(make_ctx("same"), {"n": 1})
    again = await spec.handler(make_ctx("same"), {"n": 1})
    found = await spec.lookup(make_ctx("same")) if spec.lookup else None
    missing = await spec.lookup(make_ctx("other")) if spec.lookup else "no lookup"
    await close(spec)
    assert first == again == found
    assert missing is None
    assert sim.state.ledger.charges == {"same": 1}


@pytest.mark.parametrize(
    ("fail", "error", "kind", "throttled"),
    [
        ("429", RetryableError, "rate_limited", True),
        ("5xx", RetryableError, "server_error", False),
        ("refusal", FatalError, "content_policy", False),
    ],
)
async def test_simulator_errors_map_to_the_retry_classes(
    sim: RunningSimulator, fail: str, error: type[Exception], kind: str, throttled: bool
) -> None:
    spec = build(adapter="simulated", url=sim.url)
    with pytest.raises(error) as info:
        await spec.handler(make_ctx(f"k-{fail}"), {"fail": fail})
    await close(spec)
    exc = info.value
    assert getattr(exc, "error_type", None) == kind
    if isinstance(exc, RetryableError):
        assert exc.throttled is throttled
        if throttled:
            assert exc.retry_after == 1.0  # the simulator's Retry-After: 1
    else:
        assert "refused by the content policy" in str(exc)


async def test_a_timeout_is_retryable(sim: RunningSimulator) -> None:
    spec = build(adapter="simulated", url=sim.url, timeout=0.2)
    with pytest.raises(RetryableError) as info:
        await spec.handler(make_ctx("slow"), {"fail": "timeout"})
    await close(spec)
    assert info.value.error_type == "timeout"


async def test_a_connection_failure_is_retryable() -> None:
    spec = build(adapter="http", url="http://127.0.0.1:9/generate", timeout=2)
    with pytest.raises(RetryableError) as info:
        await spec.handler(make_ctx(), {"n": 1})
    await close(spec)
    assert info.value.error_type == "connection"


async def test_malformed_output_is_returned_for_the_schema_check(sim: RunningSimulator) -> None:
    # The executor (or the poller) validates output_schema once; the adapter returns the value.
    spec = build(adapter="simulated", url=sim.url)
    result = await spec.handler(make_ctx("bad"), {"fail": "malformed"})
    await close(spec)
    assert result is None


async def test_a_key_still_in_flight_is_retried_not_failed() -> None:
    config = SimulatorConfig(latency_ms=300, latency_jitter=0)
    async with running_simulator(config) as slow:
        spec = build(adapter="simulated", url=slow.url)
        outcomes = await asyncio.gather(
            spec.handler(make_ctx("busy"), {"n": 1}),
            _later(spec.handler(make_ctx("busy"), {"n": 1}), 0.05),
            return_exceptions=True,
        )
        await close(spec)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], RetryableError)
    assert "409" in str(errors[0])


async def _later(coro: Any, delay: float) -> Any:
    await asyncio.sleep(delay)
    return await coro


# -- the simulator, async jobs ------------------------------------------------------------------
async def test_async_submit_records_the_job_then_parks(sim_async: RunningSimulator) -> None:
    spec = build(adapter="simulated", url=sim_async.url, poll_after=0.5)
    store = RefStore()
    ctx = make_ctx("job-1", store=store)
    before = ctx.now()
    info = await parked(spec.handler(ctx, {"n": 1}))
    park = info
    assert store.refs["t_1"] == park.ref == ctx.upstream_ref
    assert before + 0.5 <= park.poll_at <= ctx.now() + 0.5
    assert spec.poll is not None
    assert await spec.poll.poll(ctx, park.ref) == ("running", None)
    await asyncio.sleep(0.35)
    state, result = await spec.poll.poll(ctx, park.ref)
    await close(spec)
    assert state == "done" and result["echo"] == {"n": 1}
    assert ctx.usage is not None


async def test_a_recorded_job_is_resumed_not_resubmitted(sim_async: RunningSimulator) -> None:
    spec = build(adapter="simulated", url=sim_async.url)
    info = await parked(spec.handler(make_ctx("resume"), {"n": 2}))
    ref = info.ref
    requests = sim_async.state.stats.requests
    # Recovery: the handler runs again with ctx.upstream_ref set.
    again = await parked(spec.handler(make_ctx("resume", ref=ref), {"n": 2}))
    assert again.ref == ref
    await asyncio.sleep(0.3)
    result = await spec.handler(make_ctx("resume", ref=ref), {"n": 2})
    await close(spec)
    assert result["echo"] == {"n": 2}
    assert sim_async.state.stats.requests == requests  # no POST /generate after the first
    assert sim_async.state.ledger.charges == {"resume": 1}


async def test_a_forgotten_job_is_submitted_again(sim_async: RunningSimulator) -> None:
    spec = build(adapter="simulated", url=sim_async.url)
    info = await parked(spec.handler(make_ctx("lost", ref="job-nobody-knows"), {"n": 3}))
    await close(spec)
    assert info.ref != "job-nobody-knows"
    assert sim_async.state.stats.jobs_submitted == 1


async def test_cancel_stops_a_running_job(sim_async: RunningSimulator) -> None:
    spec = build(adapter="simulated", url=sim_async.url)
    info = await parked(spec.handler(make_ctx("stop"), {"n": 4}))
    assert spec.poll is not None
    cancel = spec.poll.cancel
    assert await cancel(make_ctx("stop"), info.ref) is True
    assert await cancel(make_ctx("stop"), info.ref) is False  # already cancelled
    assert spec.poll is not None
    state, message = await spec.poll.poll(make_ctx("stop"), info.ref)
    await close(spec)
    assert state == "failed" and "cancelled" in str(message)


# -- a provider with chosen answers -------------------------------------------------------------
def chosen_answers() -> FastAPI:
    """POST /call/{case}: answers as the case says; GET /jobs/{id}: a job per id prefix."""
    app = FastAPI()

    @app.post("/call/{case}")
    async def call(case: str, request: Request) -> Response:
        when = email.utils.formatdate(time.time() + 30, usegmt=True)
        answers: dict[str, tuple[int, str, dict[str, str]]] = {
            "408": (408, '{"error":{"message":"request timeout"}}', {}),
            "429-date": (429, '{"error":{"message":"slow down"}}', {"Retry-After": when}),
            "429-ms": (429, "{}", {"retry-after-ms": "250", "Retry-After": "9"}),
            "quota": (
                429,
                '{"error":{"type":"insufficient_quota","message":"You exceeded your quota"}}',
                {},
            ),
            "404": (404, '{"error":{"type":"not_found","message":"no such model x"}}', {}),
            "400-text": (400, "bad things in the request", {}),
            "not-json": (200, "<html>ok</html>", {}),
            "bare": (200, '{"answer":42}', {}),
            "wrapped": (200, '{"output":{"answer":42},"usage":7}', {}),
            "echo-headers": (200, "", {}),
            "202-no-status": (202, '{"job":"j-9"}', {}),
            "done-at-once": (200, '{"status":"completed","output":{"x":1}}', {}),
            "failed-at-once": (
                200,
                '{"status":"failed","error":{"type":"content_policy","message":"nope"}}',
                {},
            ),
        }
        status, body, headers = answers[case]
        if case == "echo-headers":
            import json

            body = json.dumps({"headers": dict(request.headers)})
        return Response(body, status_code=status, headers=headers, media_type="application/json")

    @app.get("/jobs/{job_id}")
    async def job(job_id: str) -> Response:
        if job_id.startswith("gone"):
            return Response('{"error":"no"}', status_code=404)
        if job_id.startswith("busy"):
            return Response('{"error":"overloaded"}', status_code=503, headers={"Retry-After": "2"})
        if job_id.startswith("refused"):
            return Response('{"status":"failed","error":{"type":"content_policy","message":"x"}}')
        return Response('{"status":"running"}')

    return app


@pytest.fixture
async def chosen() -> AsyncIterator[str]:
    async with serve_app(chosen_answers()) as url:
        yield url


async def call(url: str, case: str, **cfg: Any) -> Any:
    spec = build(adapter="http", url=f"{url}/call/{case}", **cfg)
    try:
        return await spec.handler(make_ctx(), {"q": case})
    finally:
        await close(spec)


async def test_408_is_retryable(chosen: str) -> None:
    with pytest.raises(RetryableError) as info:
        await call(chosen, "408")
    assert not info.value.throttled and "request timeout" in str(info.value)


async def test_429_with_an_http_date_retry_after(chosen: str) -> None:
    with pytest.raises(RetryableError) as info:
        await call(chosen, "429-date")
    assert info.value.throttled
    assert info.value.retry_after is not None and 25 <= info.value.retry_after <= 30


async def test_retry_after_ms_wins_over_retry_after(chosen: str) -> None:
    with pytest.raises(RetryableError) as info:
        await call(chosen, "429-ms")
    assert info.value.retry_after == 0.25


async def test_429_out_of_quota_is_fatal(chosen: str) -> None:
    with pytest.raises(FatalError) as info:
        await call(chosen, "quota")
    assert info.value.error_type == "insufficient_quota"
    assert "You exceeded your quota" in str(info.value)


async def test_other_4xx_is_fatal_with_the_providers_message(chosen: str) -> None:
    with pytest.raises(FatalError) as info:
        await call(chosen, "404")
    assert info.value.error_type == "not_found" and "no such model x" in str(info.value)
    with pytest.raises(FatalError) as text:
        await call(chosen, "400-text")
    assert "bad things in the request" in str(text.value)


async def test_a_2xx_that_is_not_json_is_invalid_output(chosen: str) -> None:
    with pytest.raises(InvalidOutput):
        await call(chosen, "not-json")


async def test_the_result_field_when_present_else_the_body(chosen: str) -> None:
    assert await call(chosen, "bare") == {"answer": 42}
    assert await call(chosen, "wrapped", result_field="output") == {"answer": 42}


async def test_headers_expand_environment_variables(
    chosen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FW_TEST_TOKEN", "s3cret")
    answer = await call(
        chosen, "echo-headers", headers={"Authorization": "Bearer ${FW_TEST_TOKEN}"}
    )
    assert answer["headers"]["authorization"] == "Bearer s3cret"
    assert answer["headers"]["idempotency-key"] == "key-1"
    monkeypatch.delenv("FW_TEST_TOKEN")
    with pytest.raises(ConfigError, match="FW_TEST_TOKEN"):
        build(adapter="http", url=chosen, headers={"Authorization": "Bearer ${FW_TEST_TOKEN}"})


async def test_async_answers_done_failed_or_a_job_without_status(chosen: str) -> None:
    jobs = {"poll_url": f"{chosen}/jobs/{{id}}", "result_field": "output", "id_field": "job"}
    assert await call(chosen, "done-at-once", **jobs) == {"x": 1}
    with pytest.raises(FatalError):
        await call(chosen, "failed-at-once", **jobs)
    info = await parked(call(chosen, "202-no-status", **jobs))
    assert info.ref == "j-9"


async def test_poll_answers(chosen: str) -> None:
    spec = build(adapter="http", url=f"{chosen}/call/x", poll_url=f"{chosen}/jobs/{{id}}")
    assert spec.poll is not None
    ctx = make_ctx()
    assert await spec.poll.poll(ctx, "run-1") == ("running", None)
    state, _ = await spec.poll.poll(ctx, "gone-1")
    assert state == "failed"
    with pytest.raises(RetryableError) as busy:  # the poll failed, not the job
        await spec.poll.poll(ctx, "busy-1")
    assert busy.value.retry_after == 2.0
    with pytest.raises(FatalError):  # a refusal fails again when resubmitted
        await spec.poll.poll(ctx, "refused-1")
    await close(spec)


def test_bad_options_are_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="poll_ratoi"):
        build(adapter="http", url="http://x", options={"poll_ratoi": 0.2})
    with pytest.raises(ConfigError, match="url"):
        build(adapter="http")
    with pytest.raises(ConfigError, match="cost"):
        build(adapter="http", url="http://x", cost="bananas")


def test_webhook_kinds_wait_callback_grace_before_polling() -> None:
    spec = build(adapter="simulated", webhook_secret="s", callback_grace=7, poll_after=1)
    assert isinstance(spec.handler, AdapterHandler)
    assert spec.handler.schedule.first_s == 7
    polled = build(adapter="simulated", poll_after=1.5).poll
    assert polled is not None and polled.schedule.first_s == 1.5
