"""Reading Anthropic's answers: a Message's billed tokens (cache tokens at their rates), a
Message Batch's result lines and its status in the batcher's words; and which tiers an
anthropic kind may offer."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from floodway.config import KindConfig
from floodway.core.tiers import LineResult
from floodway.providers.anthropic import billed_tokens
from floodway.providers.anthropic_batch import read_batch, read_line


def test_cache_tokens_are_billed_as_input_tokens_at_their_rates() -> None:
    plain = {"usage": {"input_tokens": 100, "output_tokens": 20}}
    assert billed_tokens(plain) == (100.0, 20.0)
    usage = {"input_tokens": 100, "output_tokens": 20}
    cached = {"usage": {**usage, "cache_creation_input_tokens": 1000,
                        "cache_read_input_tokens": 2000}}  # fmt: skip
    assert billed_tokens(cached) == (100 + 1.25 * 1000 + 0.1 * 2000, 20.0)
    split = {"usage": {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 300,
                       "cache_creation": {"ephemeral_5m_input_tokens": 100,
                                          "ephemeral_1h_input_tokens": 200}}}  # fmt: skip
    assert billed_tokens(split) == (10 + 1.25 * 100 + 2.0 * 200, 1.0)
    assert billed_tokens({"content": []}) is None


def test_result_lines_succeeded_errored_and_those_the_batch_ended_without() -> None:
    message = {"type": "message", "usage": {"input_tokens": 7, "output_tokens": 3}}
    ok = read_line({"custom_id": "t_1", "result": {"type": "succeeded", "message": message}})
    assert ok == LineResult("t_1", True, message, 7.0, 3.0)
    invalid = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    refused = read_line({"custom_id": "t_2", "result": {"type": "errored", "error": invalid}})
    assert refused == LineResult("t_2", False, error="bad", error_type="invalid_request_error",
                                 fatal=True)  # fmt: skip
    busy = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    later = read_line({"custom_id": "t_3", "result": {"type": "errored", "error": busy}})
    assert later is not None and not later.ok and not later.fatal
    for ended in ("canceled", "expired"):
        assert read_line({"custom_id": "t_4", "result": {"type": ended}}) is None
    assert read_line({"result": {"type": "succeeded"}}) is None


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"processing_status": "in_progress"}, "in_progress"),
        ({"processing_status": "canceling"}, "cancelling"),
        ({"processing_status": "ended", "request_counts": {"succeeded": 3}}, "completed"),
        ({"processing_status": "ended", "cancel_initiated_at": "2026-01-01T00:00:00Z"},
         "cancelled"),
        ({"processing_status": "ended", "request_counts": {"succeeded": 1, "expired": 2}},
         "expired"),
    ],
)  # fmt: skip
def test_a_batchs_processing_status_in_the_batchers_words(
    body: dict[str, object], status: str
) -> None:
    view = read_batch({"id": "msgbatch_1", **body})
    assert view.status == status
    assert view.ended == (body["processing_status"] == "ended")


def test_an_anthropic_kind_takes_the_batch_tier_but_not_flex() -> None:
    assert KindConfig(adapter="anthropic", tiers=["sync", "batch"]).tiers == ["sync", "batch"]
    with pytest.raises(ValidationError, match="Anthropic has no flex tier"):
        KindConfig(adapter="anthropic", tiers=["sync", "flex"])
    with pytest.raises(ValidationError, match="need the openai or anthropic adapter"):
        KindConfig(adapter="http", url="http://x", tiers=["sync", "batch"])
