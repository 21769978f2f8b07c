"""An OpenAI-shaped request's estimate is its worst case, whatever the request's fields say:
searched over how ``n`` and the output bounds may be written (a lenient server reads
``100.0`` and ``"100"`` as 100), which bound a provider honours when several are named, and
the model's name."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from floodway.providers.cost import (
    CHARS_PER_TOKEN,
    MAX_OUTPUT_TOKENS,
    OUTPUT_FIELDS,
    model_max_output,
    openai_estimate,
)

ABSENT = object()


def as_server_reads(value: Any) -> int | None:
    """What a lenient server takes a count field for (None: it ignores it)."""
    if isinstance(value, bool) or value is ABSENT:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


counts = st.integers(min_value=0, max_value=5000)
written = st.one_of(
    st.just(ABSENT),
    counts,
    counts.map(float),
    counts.map(str),
    st.booleans(),
    st.text(max_size=3),
    st.floats(min_value=-1e6, max_value=1e6),
)
models = st.one_of(
    st.sampled_from(sorted(MAX_OUTPUT_TOKENS)).flatmap(
        lambda prefix: st.text(max_size=8).map(lambda rest: prefix + rest)
    ),
    st.text(max_size=12),
)


@given(
    n=written,
    bounds=st.tuples(*(written for _ in OUTPUT_FIELDS)),
    model=models,
    prompt=st.text(max_size=200),
)
def test_no_request_bills_above_its_chat_estimate(
    n: Any, bounds: tuple[Any, ...], model: str, prompt: str
) -> None:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    if n is not ABSENT:
        body["n"] = n
    for name, bound in zip(OUTPUT_FIELDS, bounds, strict=True):
        if bound is not ABSENT:
            body[name] = bound
    estimate = openai_estimate("chat", None, None)(body)
    answers = as_server_reads(n) or 1
    prompt_tokens = (len(prompt) + len("user")) // CHARS_PER_TOKEN
    honoured = [b for b in (as_server_reads(v) for v in bounds) if b is not None]
    for bound in honoured or [model_max_output(model)]:
        assert estimate >= prompt_tokens + answers * bound
