"""Kinds: what a task of a given name runs, how it is limited and how it is retried."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from floodway.core.errors import ConfigError, UnknownKind
from floodway.core.task import GLOBAL_SCOPE, JSON, fingerprint, tenant_scope

if TYPE_CHECKING:
    from floodway.context import Context

Handler = Callable[["Context", Any], Awaitable[JSON]]
CostFn = Callable[[Any], float]
#: Ask the provider whether work with this idempotency key exists: its result, or None.
Lookup = Callable[["Context"], Awaitable[JSON | None]]
#: Poll an upstream job: ("done", result) | ("failed", message) | ("running", None).
Poll = Callable[["Context", str], Awaitable[tuple[str, JSON]]]
#: Who shares a kind's results: each tenant its own (the default), or every tenant ("global":
#: a saving when tenants often ask for the same work, at the price of telling one tenant that
#: another asked for it, and giving it the other's result).
Share = Literal["tenant", "global"]


@dataclass(frozen=True)
class KindSpec:
    name: str
    handler: Handler
    resource: str | None = None
    max_attempts: int = 4
    deadline_s: float | None = 900.0
    timeout_s: float | None = None
    cost: CostFn | None = None
    version: str = "1"
    dedupe: bool = True
    share: Share = "tenant"
    fallback: str | None = None
    output_schema: dict[str, Any] | None = None
    #: the provider honours the Idempotency-Key: resubmitting after a crash cannot charge twice
    idempotent: bool = False
    lookup: Lookup | None = None
    poll: Poll | None = None
    poll_after_s: float = 1.0
    poll_max_attempts: int = 30

    def work_print(self, value: JSON, tenant: str) -> str | None:
        """The fingerprint of this work for ``tenant`` (None: the kind does not dedupe)."""
        if not self.dedupe:
            return None
        scope = GLOBAL_SCOPE if self.share == "global" else tenant_scope(tenant)
        return fingerprint(self.name, self.version, value, scope)

    def estimate(self, value: JSON) -> float:
        if self.cost is None:
            return 0.0
        cost = float(self.cost(value))
        if cost < 0:
            raise ValueError(f"kind {self.name!r}: cost estimate is negative ({cost})")
        return cost


class KindRegistry:
    def __init__(self) -> None:
        self._kinds: dict[str, KindSpec] = {}

    def add(self, spec: KindSpec) -> None:
        if spec.name in self._kinds:
            raise ConfigError(f"kind {spec.name!r} is declared twice")
        if spec.max_attempts < 1:
            raise ConfigError(f"kind {spec.name!r}: max_attempts must be at least 1")
        self._kinds[spec.name] = spec

    def get(self, name: str) -> KindSpec:
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownKind(name, list(self._kinds)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def specs(self) -> list[KindSpec]:
        return list(self._kinds.values())

    def check_fallbacks(self) -> None:
        for spec in self._kinds.values():
            if spec.fallback is not None and spec.fallback not in self._kinds:
                raise ConfigError(f"kind {spec.name!r}: fallback kind {spec.fallback!r} unknown")
