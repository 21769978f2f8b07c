"""Settings of the simulated provider: its latency, its published limits and how often it
misbehaves. Every field has a default, so ``SimulatorConfig()`` is a well-behaved provider."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SimulatorConfig(BaseModel):
    """How the fake provider behaves. Rates are fractions of requests in ``[0, 1]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_ms: float = Field(500.0, ge=0, description="mean time to answer a sync request")
    latency_jitter: float = Field(
        0.2, ge=0, le=1, description="uniform spread around the mean: 0.2 = +-20 %"
    )
    max_concurrency: int = Field(0, ge=0, description="work in progress at once; 0 = no cap")
    rpm: int = Field(0, ge=0, description="requests per sliding minute; 0 = unlimited")
    rpm_burst: int = Field(
        0,
        ge=0,
        description=(
            "enforce rpm as a token bucket of this capacity (refilled at rpm / 60 per second) "
            "instead of a sliding minute; its 429s carry the exact wait (Retry-After in whole "
            "seconds, rounded up, and Retry-After-Ms); 0 = sliding minute"
        ),
    )
    rate_headers: bool = Field(
        True, description="publish x-ratelimit-* headers for the rpm and tpm limits"
    )
    tpm: int = Field(0, ge=0, description="tokens per sliding minute; 0 = unlimited")

    error_rate: float = Field(0.0, ge=0, le=1, description="answered 503 after the latency")
    timeout_rate: float = Field(0.0, ge=0, le=1, description="hang hang_s, then 504")
    refusal_rate: float = Field(0.0, ge=0, le=1, description="400 content_policy")
    malformed_rate: float = Field(0.0, ge=0, le=1, description="200 without a usable result")
    rate_limit_rate: float = Field(0.0, ge=0, le=1, description="spontaneous 429")
    hang_s: float = Field(30.0, ge=0, description="how long a timed-out request hangs")
    chunk_ms: float = Field(
        0.0, ge=0, description="OpenAI streams (--openai): the gap between two of a stream's events"
    )

    batch_hold_s: float = Field(
        0.0,
        ge=0,
        description="--openai, --anthropic: how long a provider batch (Batch API, Message "
        "Batches) takes to answer",
    )

    async_jobs: bool = Field(False, description="202 at once, the job finishes later")
    job_duration_ms: float = Field(3000.0, ge=0, description="mean async job duration")
    webhook: bool = Field(False, description="POST a signed callback when a job ends")
    webhook_drop_rate: float = Field(0.0, ge=0, le=1, description="callbacks never sent")
    webhook_secret: str = Field("sim-secret", min_length=1)

    honor_idempotency_key: bool = Field(
        True,
        description=(
            "False models a provider that ignores Idempotency-Key: every request is new work, "
            "so a resubmission shows up in the ledger as a double charge"
        ),
    )
    seed: int | None = Field(None, description="seed of the one random generator")

    @model_validator(mode="after")
    def _consistent(self) -> SimulatorConfig:
        # One uniform draw picks the outcome, so the misbehaviour rates share one unit interval.
        total = (
            self.error_rate
            + self.timeout_rate
            + self.refusal_rate
            + self.malformed_rate
            + self.rate_limit_rate
        )
        if total > 1.0 + 1e-9:
            raise ValueError(
                "error_rate + timeout_rate + refusal_rate + malformed_rate + rate_limit_rate "
                f"must not exceed 1 (got {total:g})"
            )
        if self.rpm_burst and not self.rpm:
            raise ValueError("rpm_burst needs rpm: it is the capacity of the rpm bucket")
        if self.webhook and not self.async_jobs:
            raise ValueError("webhook needs async_jobs: only async jobs call back")
        return self
