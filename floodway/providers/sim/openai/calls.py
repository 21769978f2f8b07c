"""What every simulated OpenAI call shares: the simulator's arrival decision (its
idempotency keys, limits and drawn faults), the latency, and billing into its ledger."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from floodway.providers.sim.config import SimulatorConfig
from floodway.providers.sim.model import FORCEABLE, Fate, Job, Submission
from floodway.providers.sim.openai.desk import BatchDesk
from floodway.providers.sim.openai.wire import error, json_response, rejection, sse_response
from floodway.providers.sim.state import Rejection, Replay, SimulatorState

#: the text a malformed answer holds (a proxy's error page, answered 200)
GARBAGE = "<html>502 bad gateway</html>"
#: ``metadata.fail`` that ends a stream halfway, without its end
CUT = "cut"

Answer = Callable[[Job], Awaitable[Response]]


class BadRequest(Exception):
    """A body OpenAI could not read: a 400 naming the field, nothing billed."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param

    def response(self) -> Response:
        return error(400, str(self), param=self.param)


class OpenAISimulator:
    """The simulator's state (:class:`SimulatorState`) behind the OpenAI routes."""

    def __init__(self, config: SimulatorConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.core = SimulatorState(config)
        #: the Files and Batch API's state (floodway/providers/sim/openai/batches.py)
        self.batches = BatchDesk(clock, config.batch_hold_s)
        self._background: set[asyncio.Task[None]] = set()
        self._storm = 0
        self._storm_wait_ms = 50
        #: False: a ``service_tier = "flex"`` request is answered 429 resource_unavailable,
        #: as OpenAI answers when flex has no capacity
        self.flex_available = True

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}_{uuid.uuid4().hex[:24]}"

    def storm(self, calls: int, retry_after_ms: int = 50) -> None:
        """Answer the next ``calls`` requests 429 (nothing billed), OpenAI's way."""
        self._storm += calls
        self._storm_wait_ms = retry_after_ms

    async def call(
        self, key: str | None, body: dict[str, Any], tokens: int, answer: Answer
    ) -> Response:
        """One call: refused, replayed (a billed Idempotency-Key), failed as drawn, or
        answered by ``answer`` after the latency (which bills it)."""
        core = self.core
        core.stats.requests += 1
        if self._storm > 0:
            self._storm -= 1
            core.stats.rate_limited += 1
            return rejection(Rejection(429, "rate_limited", "requests", 1, self._storm_wait_ms))
        if body.get("service_tier") == "flex" and not self.flex_available:
            core.stats.rate_limited += 1
            message = "Resource unavailable: flex processing has no capacity now."
            return error(429, message, "rate_limit_error", "resource_unavailable")
        fail = _metadata(body).get("fail")
        forced = FORCEABLE.get(fail) if isinstance(fail, str) else None
        decision = core.submit(Submission(body, tokens, key, forced, None), time.monotonic())
        if isinstance(decision, Replay):
            return _replay(decision.job)
        if isinstance(decision, Rejection):
            return rejection(decision)
        job, fate = decision.job, decision.outcome
        await core.serve(job, fate)
        if fate is Fate.OK:
            return await answer(job)
        core.finish(job, fate)
        if fate is Fate.MALFORMED:
            return Response(GARBAGE, media_type="text/html")
        if fate is Fate.REFUSAL:
            message = "Your request was rejected as a result of our safety system."
            return error(400, message, code="content_policy_violation")
        if fate is Fate.TIMEOUT:
            return error(504, "The server had an error processing your request.", "server_error")
        return error(503, "The server is overloaded or not ready yet.", "server_error")

    def bill(self, job: Job, tokens: int, result: Any) -> None:
        """The call succeeded: its usage goes to the ledger, its answer is kept for a replay."""
        job.tokens = tokens
        self.core.finish(job, Fate.OK)
        job.result = result

    async def stream(
        self, job: Job, tokens: int, events: Sequence[str], *, cut: bool = False
    ) -> AsyncIterator[str]:
        """A stream's events, ``chunk_ms`` apart; billed whatever happens to the client (the
        provider generated it all), and its slot held until the stream ends."""
        gap = self.config.chunk_ms / 1000
        try:
            for i, event in enumerate(events):
                if cut and i >= len(events) // 2:
                    return
                if i and gap:
                    await asyncio.sleep(gap)
                yield event
        finally:
            self.bill(job, tokens, list(events))

    def spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` in the background (a background response), kept until it ends."""

        async def run() -> None:
            await work

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.core.aclose()


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
    metadata = body.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def cut_requested(body: dict[str, Any]) -> bool:
    return _metadata(body).get("fail") == CUT


def _replay(job: Job) -> Response:
    """A billed Idempotency-Key again: the same answer, billed nothing."""
    headers = {"Idempotent-Replayed": "true"}
    if isinstance(job.result, list):  # a stream's events
        events = list(job.result)

        async def again() -> AsyncIterator[str]:
            for event in events:
                yield event

        response = sse_response(again())
        response.headers.update(headers)
        return response
    return json_response(job.result, headers=headers)


async def read_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError):
        raise BadRequest("body", "We could not parse the JSON body of your request.") from None
    if not isinstance(body, dict):
        raise BadRequest("body", "The request body must be a JSON object.")
    return body


def model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model", "you must provide a model parameter")
    return model


def created() -> int:
    return int(time.time())
