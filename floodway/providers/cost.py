"""Cost estimates made before a task runs (the limiter reserves them; usage settles them).

``kinds.X.cost`` picks the rule: ``"tokens"`` (about 4 characters a token, plus the output
budget ``max_tokens``), ``"chars"``, ``"fixed:N"``; unset, the adapter's own default.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from floodway.core.errors import ConfigError, InvalidInput
from floodway.kinds import CostFn

CHARS_PER_TOKEN = 4
#: output budget assumed for a chat request that sets no max_tokens (settled by usage after)
DEFAULT_MAX_TOKENS = 256
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
        for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            budget = count_field(value, name)
            if budget is not None:
                return budget
    return default


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


def chat_tokens(value: Any, default_output: int = DEFAULT_MAX_TOKENS) -> float:
    """Prompt length / 4 + ``max_tokens`` for an OpenAI-style chat request."""
    messages = value.get("messages") if isinstance(value, dict) else None
    if not isinstance(messages, list):
        return generic_tokens(value, default_output)
    chars = sum(
        len(text_of(m.get("content"))) + len(str(m.get("role", "")))
        for m in messages
        if isinstance(m, dict)
    )
    return float(chars // CHARS_PER_TOKEN + _output_budget(value, default_output))


def embedding_tokens(value: Any) -> float:
    item = value.get("input") if isinstance(value, dict) else value
    texts = item if isinstance(item, list) else [item]
    return float(sum(len(text_of(t)) for t in texts) // CHARS_PER_TOKEN)


def image_count(value: Any) -> float:
    n = count_field(value, "n") if isinstance(value, dict) else None
    return float(n) if n else 1.0


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
