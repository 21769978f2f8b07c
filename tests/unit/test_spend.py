"""Prices, estimates and budget periods (floodway.core.spend), and the settings they come
from: a kind's price wins over its resource's, a named tenant's budget over the default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from floodway.config import Settings, load_settings
from floodway.core.errors import ConfigError
from floodway.core.spend import Budget, Price, Usage
from floodway.pricing import Pricing
from floodway.providers.cost import DEFAULT_MAX_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS


def test_a_price_costs_each_part_of_the_usage() -> None:
    price = Price(input_per_1m=2.5, output_per_1m=10.0, per_request=0.01, per_image=0.04)
    assert price.cost(Usage(input_tokens=1_000_000)) == pytest.approx(2.51)
    assert price.cost(Usage(output_tokens=500_000)) == pytest.approx(5.01)
    assert price.cost(Usage(images=3)) == pytest.approx(0.13)
    assert Price().cost(Usage(1e9, 1e9, 1e9)) == 0.0


def test_an_estimate_prices_every_token_at_the_dearer_rate() -> None:
    price = Price(input_per_1m=1.0, output_per_1m=4.0, per_request=0.5)
    assert price.estimate(1_000_000, images=False) == pytest.approx(4.5)
    # It bounds the real cost of any split of those tokens.
    for out in (0, 250_000, 1_000_000):
        usage = Usage(input_tokens=1_000_000 - out, output_tokens=out)
        assert price.cost(usage) <= price.estimate(1_000_000, images=False)
    assert Price(per_image=0.04).estimate(2, images=True) == pytest.approx(0.08)


def test_budget_periods_are_aligned_on_the_epoch() -> None:
    day = Budget(amount=50.0, period_s=86400.0)
    noon = 1_700_000_000.0 // 86400 * 86400 + 43200
    assert day.period_start(noon) == noon - 43200
    assert day.resets_at(noon) == noon + 43200
    assert day.period_start(noon + 43200) == noon + 43200  # the reset instant is the next


def test_a_kind_s_price_wins_over_its_resource_s() -> None:
    settings = Settings(
        resources={"llm": {"price": {"input_per_1m": 1.0}}},
        kinds={
            "cheap": {"resource": "llm"},
            "dear": {"resource": "llm", "price": {"input_per_1m": 3.0}},
            "pictures": {"adapter": "openai", "endpoint": "images", "price": {"per_image": 0.1}},
        },
    )
    pricing = Pricing(settings)
    million = Usage(input_tokens=1_000_000)
    assert pricing.charge("cheap", "llm", million).cost == 1.0
    assert pricing.charge("dear", "llm", million).cost == 3.0
    assert pricing.charge("unpriced", None, million).cost == 0.0
    assert pricing.hold("pictures", None, 2) == pytest.approx(0.2)
    assert pricing.hold("unpriced", None, 1e6) == 0.0


def test_named_tenant_sections_beside_the_defaults() -> None:
    settings = Settings(
        tenants={
            "concurrency": 4,
            "budget": {"amount": 50.0, "period": "1d"},
            "acme": {"budget": {"amount": 5.0, "period": "1h"}},
        }
    )
    pricing = Pricing(settings)
    assert settings.tenants.concurrency == 4
    assert pricing.budget_of("acme") == Budget(5.0, 3600.0)
    assert pricing.budget_of("anyone") == Budget(50.0, 86400.0)
    assert Pricing(Settings()).budget_of("anyone") is None


def test_a_wrong_key_in_a_tenant_section_names_it(tmp_path: Path) -> None:
    path = tmp_path / "f.toml"
    path.write_text("[tenants.acme]\nbudget = { amount = 5.0 }\nconcurrency = 3\n")
    with pytest.raises(ConfigError, match=r"tenants\.acme\.concurrency: unknown key"):
        load_settings(path)
    path.write_text("[tenants]\nbudget = { amount = -1 }\n")
    with pytest.raises(ConfigError, match=r"tenants\.budget\.amount"):
        load_settings(path)


def test_the_examples_of_docs_spend_md_load(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "spend.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 3
    loaded = []
    for number, block in enumerate(blocks):
        path = tmp_path / f"example-{number}.toml"
        path.write_text(block)
        loaded.append(Pricing(load_settings(path)))
    prices, tiers, budgets = loaded
    assert prices.price_of("summarize", "llm") == Price(0.15, 0.6, 0.0, 0.0)
    batch = Price(0.15, 0.6).on("batch")
    assert (batch.input_per_1m, batch.output_per_1m) == (0.075, 0.3)
    assert tiers.price_of("describe", None) == Price(0.15, 0.6)
    assert tiers.settings.kinds["describe"].tiers == ["sync", "flex", "batch"]
    assert prices.price_of("images", None) == Price(per_image=0.04)
    assert budgets.budget_of("acme") == Budget(500.0, 30 * 86400.0)
    assert budgets.budget_of("anyone") == Budget(50.0, 86400.0)


def test_the_documented_output_limits_are_the_estimates() -> None:
    """docs/spend.md's table of each model's longest answer is the one estimates use."""
    doc = (Path(__file__).parents[2] / "docs" / "spend.md").read_text()
    rows = dict(re.findall(r"^  \| `([^`]+)` \| ([\d,]+) \|$", doc, re.MULTILINE))
    assert {m: int(n.replace(",", "")) for m, n in rows.items()} == MAX_OUTPUT_TOKENS
    assert f"| any other | {DEFAULT_MAX_OUTPUT_TOKENS:,} |" in doc
