"""A tenant's view of the resources (``tenant_resources``), searched over many ledgers and
limiter states: it holds only the resources its own kinds use, only the fields a tenant may
see, and no figure that another tenant's tasks move."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from floodway.api.stats import tenant_resources
from floodway.kinds import KindRegistry, KindSpec
from floodway.store.base import StoreStats

TENANTS = ("a", "b", "c")
RESOURCES = ("llm", "images", "other")
KINDS = {"chat": "llm", "draw": "images", "plain": None, "embed": "llm"}
STATUSES = ("queued", "running", "succeeded")
TENANT_FIELDS = {
    "concurrency",
    "limits",
    "paused_for",
    "next_admission_in",
    "kinds",
    "in_flight",
    "held_back_by",
}


async def nothing(ctx: Any, inp: Any) -> Any:
    return None


def registry() -> KindRegistry:
    kinds = KindRegistry()
    for name, resource in KINDS.items():
        kinds.add(KindSpec(name=name, handler=nothing, resource=resource))
    return kinds


counts_of = st.dictionaries(
    st.sampled_from(sorted(KINDS)),
    st.dictionaries(st.sampled_from(STATUSES), st.integers(1, 50), min_size=1),
)
reasons = st.dictionaries(
    st.sampled_from(("concurrency", "requests", "tenant cap")), st.integers(1, 99)
)


@st.composite
def snapshots(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    found = {}
    for name in draw(st.sets(st.sampled_from(RESOURCES))):
        held = draw(st.dictionaries(st.sampled_from(TENANTS), reasons))
        found[name] = {
            "concurrency": draw(st.integers(0, 10)),
            "limits": {"concurrency": {"value": 10.0, "source": "configured"}},
            "paused_for": 0.0,
            "next_admission_in": None,
            "in_flight": draw(st.integers(0, 1000)),  # every tenant's
            "sending_per_min": 1.0,
            "throttles": draw(st.integers(0, 1000)),
            "held_back_by": {"concurrency": 1000},
            "held_back_by_tenant": held,
            "requests": {"capacity": 10.0, "level": 3.0, "refill_per_s": 1.0},
        }
    return found


@given(st.sampled_from(TENANTS), counts_of, snapshots(), st.data())
def test_a_tenant_sees_its_own_use_of_its_kinds_resources_only(
    tenant: str, by_kind: dict[str, dict[str, int]], snaps: dict[str, Any], data: st.DataObject
) -> None:
    counts = StoreStats({}, by_kind)
    view = tenant_resources(registry(), tenant, counts, snaps)
    used = {KINDS[k] for k in by_kind} - {None}
    assert set(view) == used & set(snaps)
    for name, seen in view.items():
        assert set(seen) == TENANT_FIELDS
        assert seen["kinds"] == sorted(k for k in by_kind if KINDS[k] == name)
        assert seen["in_flight"] == sum(by_kind[k].get("running", 0) for k in seen["kinds"])
        assert seen["held_back_by"] == snaps[name]["held_back_by_tenant"].get(tenant, {})
    # Other tenants' figures move nothing in it.
    moved = {
        name: {
            **snap,
            "in_flight": data.draw(st.integers(0, 1000)),
            "throttles": data.draw(st.integers(0, 1000)),
            "held_back_by_tenant": {
                **{t: data.draw(reasons) for t in TENANTS if t != tenant},
                **(
                    {tenant: snap["held_back_by_tenant"][tenant]}
                    if tenant in snap["held_back_by_tenant"]
                    else {}
                ),
            },
        }
        for name, snap in snaps.items()
    }
    assert tenant_resources(registry(), tenant, counts, moved) == view
