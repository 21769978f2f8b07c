"""Choose the admission control for a configuration."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from floodway.clock import Clock
from floodway.config import Settings
from floodway.kinds import KindRegistry
from floodway.limits.admission import AdmissionTuning, LimitsAdmission
from floodway.limits.backend import LimiterBackend
from floodway.limits.base import Admission, NoLimits
from floodway.limits.local import LocalLimiterBackend


def build_backend(settings: Settings, clock: Clock) -> LimiterBackend:
    """Redis when ``redis`` is set (limits shared by every process), else in-process."""
    if settings.redis:
        from floodway.limits.redis_backend import RedisLimiterBackend

        return RedisLimiterBackend.from_url(settings.redis, settings.redis_prefix)
    return LocalLimiterBackend(clock)


def build_admission(
    settings: Settings,
    kinds: KindRegistry,
    clock: Clock,
    *,
    backend: LimiterBackend | None = None,
    tuning: AdmissionTuning | None = None,
) -> Admission:
    """No resources and no tenant cap -> :class:`NoLimits` (claims skip the listing step)."""
    if not settings.resources and not settings.tenants.concurrency:
        return NoLimits()
    return LimitsAdmission(
        settings.resources,
        KindResources(kinds),
        settings.tenants,
        backend or build_backend(settings, clock),
        clock,
        tuning,
    )


class KindResources(Mapping[str, str]):
    """kind -> resource, read live from the registry: a kind declared after the admission was
    built is still limited."""

    def __init__(self, kinds: KindRegistry) -> None:
        self._kinds = kinds

    def __getitem__(self, kind: str) -> str:
        if kind in self._kinds:
            resource = self._kinds.get(kind).resource
            if resource is not None:
                return resource
        raise KeyError(kind)

    def __iter__(self) -> Iterator[str]:
        return (s.name for s in self._kinds.specs() if s.resource is not None)

    def __len__(self) -> int:
        return sum(1 for s in self._kinds.specs() if s.resource is not None)
