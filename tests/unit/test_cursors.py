"""Page cursors (floodway.wire.cursors): a position comes back only to its tenant and list."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodway.wire.cursors import KEY_BYTES, CursorRefused, Cursors

CURSORS = Cursors(os.urandom(KEY_BYTES))
tenants = st.text(min_size=1, max_size=20)
positions = st.integers(min_value=0, max_value=2**63 - 1)


@given(tenants, positions)
def test_a_cursor_reads_back_for_its_tenant_and_list(tenant: str, position: int) -> None:
    assert CURSORS.decode(tenant, "tasks", CURSORS.encode(tenant, "tasks", position)) == position


@given(tenants, tenants, positions)
def test_a_cursor_is_refused_for_another_tenant_or_list(a: str, b: str, position: int) -> None:
    cursor = CURSORS.encode(a, "tasks", position)
    if a != b:
        with pytest.raises(CursorRefused):
            CURSORS.decode(b, "tasks", cursor)
    with pytest.raises(CursorRefused):
        CURSORS.decode(a, "events", cursor)


@given(positions, positions)
def test_cursors_do_not_show_how_far_apart_their_positions_are(p: int, q: int) -> None:
    """Same length whatever the position, so not even the size of the sequence shows."""
    assert len(CURSORS.encode("t", "tasks", p)) == len(CURSORS.encode("t", "tasks", q))


@given(st.text(max_size=60))
def test_any_other_string_is_refused_not_an_error(text: str) -> None:
    with pytest.raises(CursorRefused):
        CURSORS.decode("t", "tasks", text)


def test_another_deployment_s_cursor_is_refused() -> None:
    cursor = Cursors(os.urandom(KEY_BYTES)).encode("t", "tasks", 7)
    with pytest.raises(CursorRefused):
        CURSORS.decode("t", "tasks", cursor)
