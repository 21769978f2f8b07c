"""Prices and budgets from the settings: which price a kind's calls cost, what a task may be
estimated at before it runs, and which budget a tenant has. The arithmetic is
:mod:`floodway.core.spend`'s."""

from __future__ import annotations

from dataclasses import dataclass

from floodway.config import PriceConfig, Settings
from floodway.core.spend import Budget, Charge, Price, Usage


def _price(config: PriceConfig) -> Price:
    return Price(
        config.input_per_1m,
        config.output_per_1m,
        config.per_request,
        config.per_image,
        config.batch_discount,
        config.batch_input_per_1m,
        config.batch_output_per_1m,
    )


@dataclass(frozen=True)
class Pricing:
    settings: Settings

    def price_of(self, kind: str, resource: str | None) -> Price | None:
        """The kind's price, else its resource's; None: its calls are free."""
        own = self.settings.kinds.get(kind)
        if own is not None and own.price is not None:
            return _price(own.price)
        pool = self.settings.resources.get(resource) if resource else None
        if pool is not None and pool.price is not None:
            return _price(pool.price)
        return None

    def charge(self, kind: str, resource: str | None, usage: Usage) -> Charge:
        """What a call that billed ``usage`` cost on its tier, and what that saved against
        the sync price."""
        price = self.price_of(kind, resource)
        if price is None:
            return Charge(usage, 0.0, usage.tier)
        cost = price.on(usage.tier).cost(usage)
        return Charge(usage, cost, usage.tier, price.cost(usage) - cost)

    def hold(self, kind: str, resource: str | None, units: float) -> float:
        """What a task of ``kind`` estimated at ``units`` (its metered unit) may cost."""
        price = self.price_of(kind, resource)
        if price is None:
            return 0.0
        return price.estimate(units, images=self._counts_images(kind))

    def _counts_images(self, kind: str) -> bool:
        own = self.settings.kinds.get(kind)
        return own is not None and own.adapter == "openai" and own.endpoint == "images"

    def budget_of(self, tenant: str) -> Budget | None:
        config = self.settings.tenants.budget_of(tenant)
        return None if config is None else Budget(config.amount, config.period)
