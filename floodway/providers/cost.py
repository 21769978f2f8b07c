"""Cost estimates made before a task runs (the limiter reserves them; usage settles them).

``kinds.X.cost`` picks the rule: ``"tokens"`` (about 4 characters a token, plus the output
budget ``max_tokens``), ``"chars"``, ``"fixed:N"``; unset, the adapter's own default.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from floodway.core.errors import ConfigError
from floodway.kinds import CostFn

CHARS_PER_TOKEN = 4
#: output budget assumed for a chat request that sets no max_tokens (settled by usage after)
DEFAULT_MAX_TOKENS = 256


def _chars(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _output_budget(value: Any, default: int) -> int:
    if isinstance(value, dict):
        for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            budget = value.get(name)
            if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0:
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
        tokens = value.get("tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
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
    n = value.get("n", 1) if isinstance(value, dict) else 1
    return float(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1.0


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
