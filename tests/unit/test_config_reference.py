"""docs/configuration.md is what the settings models say, and the examples of
docs/adapters.md load and build as they are written."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from floodway.config import KindOptions, Settings, load_settings
from floodway.kinds import KindRegistry
from floodway.providers.registry import aclose_kinds, build_provider_kind
from harness.config_reference import ADAPTERS, render

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _models(model: type[BaseModel]) -> list[type[BaseModel]]:
    """``model`` and every model its fields hold, however nested (dict values, optionals): a
    section added to the settings is checked without being listed here."""
    found = [model]
    for field in model.model_fields.values():
        pending: list[Any] = [field.annotation]
        while pending:
            kind = pending.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found += [m for m in _models(kind) if m not in found]
            pending += get_args(kind)
    return found


# KindOptions: a kind's `options` table, a plain dict in the settings that the registry validates
MODELS = [*_models(Settings), KindOptions]


def test_the_configuration_reference_is_up_to_date() -> None:
    written = (DOCS / "configuration.md").read_text()
    assert written == render(), (
        "docs/configuration.md is stale: run "
        "`python -m harness.config_reference > docs/configuration.md`"
    )


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_key_says_what_it_does(model: type[BaseModel]) -> None:
    missing = [name for name, field in model.model_fields.items() if not field.description]
    nested = {"api", "worker", "retention", "callbacks", "jobs", "tenants", "resources", "kinds"}
    assert [m for m in missing if model is not Settings or m not in nested] == []


def toml_blocks(text: str) -> list[str]:
    return re.findall(r"```toml\n(.*?)```", text, re.DOTALL)


async def test_every_adapter_example_loads_and_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPEECH_API_KEY", "sk-speech")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    text = (DOCS / "adapters.md").read_text()
    for adapter in ADAPTERS:
        assert f"## `{adapter}`" in text, adapter
    blocks = toml_blocks(text)
    seen = set()
    for number, block in enumerate(blocks):
        config = tmp_path / f"example-{number}.toml"
        config.write_text(block)
        settings = load_settings(config)
        registry = KindRegistry()
        for name, kind in settings.kinds.items():
            seen.add(kind.adapter)
            if kind.adapter != "python":  # a python kind imports the user's own module
                registry.add(build_provider_kind(name, kind))
        await aclose_kinds(registry)
        assert tomllib.loads(block)  # and it is plain TOML a user can copy
    assert seen == set(ADAPTERS)
