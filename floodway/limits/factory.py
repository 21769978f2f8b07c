"""Choose the admission control for a configuration."""

from __future__ import annotations

from floodway.clock import Clock
from floodway.config import Settings
from floodway.kinds import KindRegistry
from floodway.limits.base import Admission, NoLimits


def build_admission(settings: Settings, kinds: KindRegistry, clock: Clock) -> Admission:
    """No resources and no tenant cap -> :class:`NoLimits` (claims skip the listing step)."""
    if not settings.resources and not settings.tenants.concurrency:
        return NoLimits()
    raise NotImplementedError("resource limits land with the limits work")  # replaced below
