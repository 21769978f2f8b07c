"""Cost estimates made before a task runs (the limiter reserves them; usage settles them; a
budget admits a task by its estimate, priced).

``kinds.X.cost`` picks the rule: ``"tokens"`` (about 4 characters a token, plus the output
budget ``max_tokens``), ``"chars"``, ``"fixed:N"``; unset, the adapter's own default. An
OpenAI-shaped request's output is estimated at its worst case (:func:`openai_estimate`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from floodway.core.errors import ConfigError, InvalidInput
from floodway.kinds import CostFn

CHARS_PER_TOKEN = 4
#: The request fields that bound a call's output tokens (chat's two names, the Responses API's).
OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
#: The most output tokens one answer of a model may bill (its provider's published limit), by
#: model-name prefix, the longest matching prefix first: what a request that sets none of
#: OUTPUT_FIELDS is estimated at, unless its kind sets ``max_output_tokens``.
MAX_OUTPUT_TOKENS: dict[str, int] = {
    "gpt-5": 128_000,
    "gpt-4.1": 32_768,
    "gpt-4o": 16_384,
    "chatgpt-4o": 16_384,
    "gpt-4-turbo": 4_096,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 4_096,
    "o1-mini": 65_536,
    "o1": 100_000,
    "o3": 100_000,
    "o4-mini": 100_000,
}
#: a model the table does not know (set the kind's ``max_output_tokens`` for it)
DEFAULT_MAX_OUTPUT_TOKENS = 16_384
#: the largest count a request may name (max_tokens, n): OpenAI's API takes 32-bit integers
MAX_COUNT = 2**31 - 1


def _chars(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def count_field(value: dict[str, Any], name: str) -> int | None:
    """``value[name]`` as a count (tokens, images): None when absent; a whole number from 0 to
    :data:`MAX_COUNT`, else the caller's error (it would be reserved against the limits)."""
    count = value.get(name)
    if count is None:
        return None
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_COUNT:
        raise InvalidInput(f"{name} must be a whole number from 0 to {MAX_COUNT}")
    return count


def _output_budget(value: Any, default: int) -> int:
    if isinstance(value, dict):
        for name in OUTPUT_FIELDS:
            budget = count_field(value, name)
            if budget is not None:
                return budget
    return default


def model_max_output(model: str | None) -> int:
    """The most output tokens one answer of ``model`` may bill (:data:`MAX_OUTPUT_TOKENS`)."""
    if model:
        for prefix in sorted(MAX_OUTPUT_TOKENS, key=len, reverse=True):
            if model.startswith(prefix):
                return MAX_OUTPUT_TOKENS[prefix]
    return DEFAULT_MAX_OUTPUT_TOKENS


def text_of(content: Any) -> str:
    """The text of a message ``content``: a string, or a list of parts with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return ""


def generic_tokens(value: Any, default_output: int = 0) -> float:
    """An explicit ``tokens`` field, else the input's JSON length / 4, plus ``max_tokens``."""
    if isinstance(value, dict):
        tokens = count_field(value, "tokens")
        if tokens is not None:
            return float(tokens)
    return float(_chars(value) // CHARS_PER_TOKEN + _output_budget(value, default_output))


def _prompt_tokens(messages: list[Any]) -> int:
    chars = sum(
        len(text_of(m.get("content"))) + len(str(m.get("role", "")))
        for m in messages
        if isinstance(m, dict)
    )
    return chars // CHARS_PER_TOKEN


def embedding_tokens(value: Any) -> float:
    item = value.get("input") if isinstance(value, dict) else value
    texts = item if isinstance(item, list) else [item]
    return float(sum(len(text_of(t)) for t in texts) // CHARS_PER_TOKEN)


def image_count(value: Any) -> float:
    n = count_field(value, "n") if isinstance(value, dict) else None
    return float(n) if n else 1.0


def openai_estimate(endpoint: str, model: str | None, max_output: int | None) -> CostFn:
    """The estimate of a request to an OpenAI-shaped ``endpoint`` at its worst case: its
    prompt, plus ``n`` answers (chat's ``n``) of at most the request's output bound, else
    ``max_output`` (the kind's), else its model's (the request's ``model``, else ``model``).
    Images count ``n`` images. No field of the request lowers it below that (a ``tokens``
    field is the generic rule's, not an OpenAI request's)."""
    if endpoint == "embeddings":
        return embedding_tokens
    if endpoint == "images":
        return image_count

    def output(value: dict[str, Any]) -> int:
        named = value.get("model")
        ceiling = max_output or model_max_output(named if isinstance(named, str) else model)
        return _output_budget(value, ceiling)

    def estimate(value: Any) -> float:
        if not isinstance(value, dict):
            return float(_chars(value) // CHARS_PER_TOKEN)
        messages = value.get("messages")
        if endpoint == "chat" and isinstance(messages, list):
            answers = count_field(value, "n") or 1
            return float(_prompt_tokens(messages) + answers * output(value))
        return float(_chars(value) // CHARS_PER_TOKEN + output(value))

    return estimate


def cost_rule(rule: str | None, default: CostFn | None, where: str) -> CostFn | None:
    """The cost function for a ``cost = "..."`` setting (``where`` names the key in errors)."""
    if rule is None:
        return default
    text = rule.strip()
    if text == "tokens":
        return default if default is not None else generic_tokens
    if text == "chars":
        return lambda value: float(_chars(value))
    if text.startswith("fixed:"):
        try:
            amount = float(text.removeprefix("fixed:"))
        except ValueError:
            amount = -1.0
        if amount < 0:
            raise ConfigError(f"{where}: 'fixed:N' needs a non-negative number, not {rule!r}")
        return _constant(amount)
    raise ConfigError(f"{where}: unknown cost rule {rule!r} (use tokens, chars or fixed:N)")


def _constant(amount: float) -> Callable[[Any], float]:
    return lambda _value: amount
