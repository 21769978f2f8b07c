"""An OpenAI-shaped request's estimate is its worst case, whatever the request's fields say:
searched over how ``n`` and the output bounds may be written (a count written other than as
a whole number is refused, since a lenient server would read ``100.0`` or ``"100"`` as 100),
which bound a provider honours when several are named, and the model's name."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodway.core.errors import InvalidInput
from floodway.providers.cost import (
    CHARS_PER_TOKEN,
    MAX_OUTPUT_TOKENS,
    OUTPUT_FIELDS,
    model_max_output,
    openai_estimate,
)

ABSENT = object()


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    rule = openai_estimate("chat", None, None)
    if any(v is not ABSENT and not _whole(v) for v in (n, *bounds)):
        with pytest.raises(InvalidInput):
            rule(body)
        return
    estimate = rule(body)
    answers = (n if _whole(n) else None) or 1
    prompt_tokens = (len(prompt) + len("user")) // CHARS_PER_TOKEN
    honoured = [b for b in bounds if _whole(b)]
    for bound in honoured or [model_max_output(model)]:
        assert estimate >= prompt_tokens + answers * bound
