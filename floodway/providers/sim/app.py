"""The HTTP face of the simulator: routes translate between the wire and :class:`SimulatorState`.

Responses are serialised by hand into :class:`Response` objects: FastAPI's generic encoder would
cost more than the rest of a request, and the simulator has to keep up with 1,000+ requests/s.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from floodway.providers.sim.config import SimulatorConfig
from floodway.providers.sim.model import Fate, InvalidSubmission, Job, parse_submission
from floodway.providers.sim.state import Admission, Rejection, Replay, SimulatorState
from floodway.providers.sim.window import RateWindow


def create_simulator_app(config: SimulatorConfig) -> FastAPI:
    """A fresh simulated provider; its state is ``simulator_state(app)``."""
    state = SimulatorState(config)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await state.aclose()

    app = FastAPI(title="floodway simulated provider", lifespan=lifespan)
    app.state.simulator = state
    if config.rate_headers:
        app.add_middleware(RateLimitHeaders, window=state.window)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    _add_work_routes(app, state)
    _add_control_routes(app, state)
    return app


def simulator_state(app: FastAPI) -> SimulatorState:
    state = app.state.simulator
    assert isinstance(state, SimulatorState)
    return state


def _add_work_routes(app: FastAPI, state: SimulatorState) -> None:
    @app.post("/generate")
    async def generate(request: Request) -> Response:
        state.stats.requests += 1
        try:
            sub = parse_submission(await request.body(), request.headers.get("idempotency-key"))
        except InvalidSubmission as exc:
            state.stats.invalid += 1
            return error_response(400, "invalid_request", str(exc))
        decision = state.submit(sub, time.monotonic())
        if isinstance(decision, Replay):
            return json_response(200, decision.job.view(), {"Idempotent-Replayed": "true"})
        if isinstance(decision, Rejection):
            return rejection_response(decision)
        return await _work(state, decision)

    @app.get("/jobs/{job_id}")
    async def get_job(job_id: str) -> Response:
        job = state.poll(job_id)
        if job is None:
            return error_response(404, "not_found", f"no job {job_id}")
        return json_response(200, job.view())

    @app.get("/jobs")
    async def find_job(request: Request) -> Response:
        key = request.query_params.get("idempotency_key")
        if not key:
            return error_response(400, "invalid_request", "idempotency_key is required")
        job = state.lookup(key)
        if job is None:
            return error_response(404, "not_found", "no job for this idempotency key")
        return json_response(200, job.view())

    @app.delete("/jobs/{job_id}")
    async def cancel_job(job_id: str) -> Response:
        outcome = state.cancel(job_id)
        if isinstance(outcome, Rejection):
            return rejection_response(outcome)
        return json_response(200, outcome.view())


def _add_control_routes(app: FastAPI, state: SimulatorState) -> None:
    @app.get("/ledger")
    async def ledger() -> Response:
        return json_response(200, state.ledger.as_dict())

    @app.get("/stats")
    async def stats() -> Response:
        return json_response(200, state.stats.as_dict())

    @app.post("/reset")
    async def reset() -> Response:
        state.reset()
        return json_response(200, {"reset": True})


async def _work(state: SimulatorState, admission: Admission) -> Response:
    job, outcome = admission.job, admission.outcome
    try:
        if outcome is Fate.TIMEOUT:
            await state.hang()
        elif state.config.async_jobs and outcome is not Fate.REFUSAL:
            state.launch(job, outcome)
            return json_response(202, {"id": job.id, "status": "running"})
        elif not state.config.async_jobs:
            await asyncio.sleep(state.latency_s())
    except asyncio.CancelledError:
        state.abandon(job)
        raise
    state.finish(job, outcome)
    return job_response(job)


def job_response(job: Job) -> Response:
    if job.status == "succeeded":
        return json_response(200, job.view())
    assert job.error is not None
    return json_response(job.failure_status(), {"error": job.error})


def json_response(status: int, body: Any, headers: Mapping[str, str] | None = None) -> Response:
    content = json.dumps(body, separators=(",", ":"))
    return Response(content, status_code=status, media_type="application/json", headers=headers)


def error_response(
    status: int, kind: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return json_response(status, {"error": {"type": kind, "message": message}}, headers)


def rejection_response(rejection: Rejection) -> Response:
    headers = {}
    if rejection.retry_after is not None:
        headers["Retry-After"] = str(rejection.retry_after)
    if rejection.retry_after_ms is not None:
        headers["Retry-After-Ms"] = str(rejection.retry_after_ms)
    return error_response(rejection.status, rejection.type, rejection.message, headers)


_HTTP_ERROR_TYPES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(_request: Request, exc: Exception) -> Response:
    # Unknown routes and methods answer in the simulator's error shape, not FastAPI's.
    assert isinstance(exc, StarletteHTTPException)
    kind = _HTTP_ERROR_TYPES.get(exc.status_code, "invalid_request")
    return error_response(exc.status_code, kind, str(exc.detail), exc.headers)


class RateLimitHeaders:
    """Adds the rate-limit headers, as of the moment of answering, to every response: the
    x-ratelimit-* ones, or those ``written`` from the window (Anthropic's, say).

    A raw ASGI middleware: Starlette's BaseHTTPMiddleware would add a task per request."""

    def __init__(
        self,
        app: ASGIApp,
        window: RateWindow,
        written: Callable[[RateWindow, float], list[tuple[bytes, bytes]]] = RateWindow.headers,
    ) -> None:
        self.app = app
        self.window = window
        self.written = written

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.window.limited:
            await self.app(scope, receive, send)
            return

        async def send_with_limits(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = self.written(self.window, time.monotonic())
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_limits)


class RequestIds:
    """Names every answer in ``header``, as the provider does (OpenAI's ``x-request-id``,
    Anthropic's ``request-id``), and notes the ids ``sent`` (the latest few), so a test can
    tell which answer floodway kept."""

    #: how many of the latest ids are noted
    KEPT = 1024

    def __init__(self, app: ASGIApp, header: str, sent: deque[str]) -> None:
        self.app = app
        self.header = header
        self.sent = sent

    @classmethod
    def sent_log(cls) -> deque[str]:
        return deque(maxlen=cls.KEPT)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                request_id = f"req_{uuid.uuid4().hex}"
                MutableHeaders(scope=message)[self.header] = request_id
                self.sent.append(request_id)
            await send(message)

        await self.app(scope, receive, with_id)
