"""The one retry policy: classification, full jitter, Retry-After, budgets, poison, deadline."""

from __future__ import annotations

import random

import httpx
from hypothesis import given
from hypothesis import strategies as st

from floodway.core.backoff import Backoff
from floodway.core.errors import FatalError, InvalidOutput, RetryableError
from floodway.core.outcome import Cancelled, Failed, Succeeded
from floodway.core.retry import RetryPolicy
from floodway.core.states import Status
from floodway.core.task import ErrorClass, ErrorInfo, Lane, Task

NOW = 1_000.0


def running(**kw: object) -> Task:
    base: dict[str, object] = dict(
        id="t_1",
        kind="k",
        status=Status.RUNNING,
        lane=Lane.BACKGROUND,
        tenant="a",
        input={},
        attempts=1,
        max_attempts=4,
        lease_token="tok",
    )
    base.update(kw)
    return Task(**base)  # type: ignore[arg-type]


@given(attempt=st.integers(1, 30), seed=st.integers(0, 2**32))
def test_full_jitter_is_bounded_by_the_cap(attempt: int, seed: int) -> None:
    b = Backoff(base_s=1.0, cap_s=60.0)
    delay = b.delay(attempt, random.Random(seed))
    assert 0.0 <= delay <= min(60.0, 2 ** (attempt - 1))


def test_full_jitter_spreads_over_the_whole_window() -> None:
    rng = random.Random(7)
    delays = [Backoff().delay(4, rng) for _ in range(2000)]
    assert min(delays) < 0.5 and max(delays) > 7.5  # window is [0, 8]


def test_retry_after_wins_over_backoff() -> None:
    c = RetryPolicy().decide(
        running(),
        Failed(ErrorInfo(ErrorClass.RETRYABLE, "http_503", "busy"), retry_after=42.0),
        NOW,
    )
    assert c.to is Status.RETRYING and c.next_attempt_at == NOW + 42.0


def test_fatal_is_never_retried() -> None:
    policy = RetryPolicy()
    failed = policy.classify(FatalError("refused", type="content_policy"))
    c = policy.decide(running(attempts=1), failed, NOW)
    assert c.to is Status.FAILED and c.error is not None
    assert c.error.cls is ErrorClass.FATAL and c.error.type == "content_policy"


def test_exhausted_goes_dead() -> None:
    policy = RetryPolicy()
    c = policy.decide(
        running(attempts=4, max_attempts=4), policy.classify(RetryableError("503")), NOW
    )
    assert c.to is Status.DEAD and c.error is not None and c.error.cls is ErrorClass.EXHAUSTED


def test_throttle_does_not_spend_the_retry_budget() -> None:
    policy = RetryPolicy()
    c = policy.decide(
        running(attempts=4, max_attempts=4),
        policy.classify(RetryableError("429", retry_after=3, throttled=True)),
        NOW,
    )
    assert c.to is Status.RETRYING and c.refund_attempt and c.next_attempt_at == NOW + 3


def test_retry_past_the_deadline_is_timeout() -> None:
    policy = RetryPolicy()
    c = policy.decide(
        running(deadline_at=NOW + 5), policy.classify(RetryableError("busy", retry_after=10)), NOW
    )
    assert c.to is Status.TIMEOUT


def test_poison_after_three_invalid_outputs() -> None:
    policy = RetryPolicy()
    bad = policy.classify(InvalidOutput("no url"))
    first = policy.decide(running(invalid_outputs=0), bad, NOW)
    assert first.to is Status.RETRYING and first.invalid_output
    third = policy.decide(running(invalid_outputs=2, attempts=3), bad, NOW)
    assert third.to is Status.FAILED and third.error is not None
    assert third.error.cls is ErrorClass.POISON


def test_classify_timeouts_connections_and_the_unexpected_retryable() -> None:
    policy = RetryPolicy()
    assert policy.classify(TimeoutError()).error.cls is ErrorClass.RETRYABLE
    assert policy.classify(httpx.ConnectError("x")).error.cls is ErrorClass.RETRYABLE
    assert policy.classify(ConnectionResetError()).error.cls is ErrorClass.RETRYABLE
    bug = policy.classify(KeyError("bug")).error
    assert (bug.cls, bug.type, bug.message) == (
        ErrorClass.RETRYABLE,
        "unexpected",
        "KeyError: 'bug'",
    )
    assert policy.classify(FatalError("no")).error.cls is ErrorClass.FATAL


def test_success_and_cancel_writes() -> None:
    policy = RetryPolicy()
    ok = policy.decide(running(), Succeeded({"a": 1}, usage=12), NOW)
    assert ok.to is Status.SUCCEEDED and ok.result == {"a": 1} and ok.cost_actual == 12
    assert ok.lease_token == "tok" and ok.expected is Status.RUNNING
    assert policy.decide(running(), Cancelled(), NOW).to is Status.CANCELLED
