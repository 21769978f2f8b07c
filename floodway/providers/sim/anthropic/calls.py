"""What every simulated Anthropic call shares: the simulator's arrival decision (its limits and
drawn faults), the latency, Anthropic's errors, and billing into its ledger."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from floodway.providers.sim.anthropic.desk import MessageBatchDesk
from floodway.providers.sim.anthropic.wire import error, message, prompt_tokens
from floodway.providers.sim.config import SimulatorConfig
from floodway.providers.sim.model import Fate, Submission
from floodway.providers.sim.openai.calls import GARBAGE
from floodway.providers.sim.openai.wire import json_response
from floodway.providers.sim.state import Admission, Rejection, SimulatorState

VERSION_HEADER = "anthropic-version"


@dataclass
class SyncCharges:
    """What the Messages calls billed, split as Anthropic bills them."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"calls": self.calls, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens}  # fmt: skip


class AnthropicSimulator:
    def __init__(self, config: SimulatorConfig, clock: Callable[[], float] = time.time) -> None:
        # Anthropic takes no idempotency key: every request is new work.
        self.config = config.model_copy(update={"honor_idempotency_key": False})
        self.core = SimulatorState(self.config)
        self.batches = MessageBatchDesk(clock, config.batch_hold_s)
        self.sync = SyncCharges()
        self._storm: list[tuple[str, float]] = []

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}_{uuid.uuid4().hex[:24]}"

    def storm(self, calls: int, kind: str = "rate_limit_error", retry_after_s: float = 1) -> None:
        """Answer the next ``calls`` Messages calls with ``kind`` (``rate_limit_error``: 429
        with retry-after; ``overloaded_error``: 529), nothing billed."""
        self._storm += [(kind, retry_after_s)] * calls

    def refused(self, request: Request) -> Response | None:
        """Anthropic's refusal of a request without its key or version headers."""
        if not request.headers.get("x-api-key"):
            return error("authentication_error", "x-api-key header is required")
        if not request.headers.get(VERSION_HEADER):
            return error("invalid_request_error", f"{VERSION_HEADER} header is required")
        return None

    def reset(self) -> None:
        self.core.reset()
        self.batches.reset()
        self.sync = SyncCharges()

    async def call(self, body: dict[str, Any]) -> Response:
        """One Messages call: refused by a storm or the limits, failed as drawn, or answered
        after the latency (and billed)."""
        core = self.core
        core.stats.requests += 1
        if self._storm:
            kind, wait = self._storm.pop(0)
            core.stats.rate_limited += 1
            return error(kind, f"simulated {kind}", {"retry-after": str(wait)})
        tokens = prompt_tokens(body)
        decision = core.submit(Submission(body, tokens, None, None, None), time.monotonic())
        if isinstance(decision, Rejection):
            return _rejection(decision)
        assert isinstance(decision, Admission)  # no key: nothing to replay
        job, fate = decision.job, decision.outcome
        await core.serve(job, fate)
        if fate is Fate.OK:
            answer = message(body, self.new_id("msg"))
            usage = answer["usage"]
            job.tokens = usage["input_tokens"] + usage["output_tokens"]
            core.finish(job, Fate.OK)
            self.sync.calls += 1
            self.sync.input_tokens += usage["input_tokens"]
            self.sync.output_tokens += usage["output_tokens"]
            return json_response(answer)
        core.finish(job, fate)
        if fate is Fate.MALFORMED:
            return Response(GARBAGE, media_type="text/html")
        if fate is Fate.REFUSAL:
            return error("invalid_request_error", "the request was refused")
        if fate is Fate.TIMEOUT:
            return error("api_error", "the request timed out upstream")
        return error("api_error", "Internal server error")

    async def aclose(self) -> None:
        await self.core.aclose()


def _rejection(refused: Rejection) -> Response:
    if refused.status == 429:
        wait = str(refused.retry_after or 1)
        return error("rate_limit_error", f"Rate limit reached: {refused.message}",
                     {"retry-after": wait})  # fmt: skip
    if refused.type == "request_too_large":
        return error("request_too_large", refused.message)
    return error("invalid_request_error", refused.message)
