"""The API key table: every configured key finds its owner, nothing else finds one, also when
digests share their prefix (forced here by a prefix of no bytes)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodway.api import keys as keys_module
from floodway.api.keys import KeyOwner, KeyTable

KEYS = st.dictionaries(st.text(min_size=1, max_size=40), st.sampled_from(["a", "b", "c"]))


def check(plain: dict[str, str], admin: dict[str, str], others: list[str]) -> None:
    table = KeyTable(plain, admin)
    for key, tenant in plain.items():
        if key not in admin:
            assert table.owner(key) == KeyOwner(tenant, operator=False)
    for key, tenant in admin.items():
        assert table.owner(key) == KeyOwner(tenant, operator=True)
    for other in others:
        if other not in plain and other not in admin:
            assert table.owner(other) is None


@given(plain=KEYS, admin=KEYS, others=st.lists(st.text(max_size=40)))
def test_each_key_finds_its_owner_and_no_other_key_finds_one(
    plain: dict[str, str], admin: dict[str, str], others: list[str]
) -> None:
    check(plain, admin, others)


@given(plain=KEYS, admin=KEYS, others=st.lists(st.text(max_size=40)))
def test_entries_that_share_a_prefix_are_told_apart_by_the_whole_digest(
    plain: dict[str, str], admin: dict[str, str], others: list[str]
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keys_module, "_PREFIX", 0)  # every entry in one bucket
        check(plain, admin, others)


def test_a_key_is_not_matched_by_its_prefix_or_an_extension() -> None:
    table = KeyTable({"secret-key": "a"}, {})
    assert table.owner("secret-key") == KeyOwner("a", operator=False)
    for near in ("secret-ke", "secret-key2", "Secret-key", ""):
        assert table.owner(near) is None
