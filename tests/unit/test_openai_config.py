"""What a kind serves on /openai/v1, the examples of docs/openai.md, and how long a request
may wait for its task."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest

from floodway.api.routes.openai.calls import wait_budget
from floodway.api.routes.openai.catalog import served
from floodway.config import KindConfig, Settings, load_settings
from floodway.core.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_a_kind_serves_its_models_or_else_its_model() -> None:
    settings = Settings(
        kinds={
            "chat": KindConfig(adapter="openai", models=["a", "b"], model="a"),
            "embed": KindConfig(adapter="openai", endpoint="embeddings", model="e"),
            "bare": KindConfig(adapter="openai", endpoint="images"),
            "sim": KindConfig(adapter="simulated", model="x"),
        }
    )
    assert served(settings) == {
        ("chat", "a"): "chat",
        ("chat", "b"): "chat",
        ("embeddings", "e"): "embed",
    }


def test_two_kinds_serving_one_model_on_one_endpoint_stop_start_up(tmp_path: Path) -> None:
    config = tmp_path / "two.toml"
    config.write_text(
        '[kinds.one]\nadapter = "openai"\nmodels = ["m"]\n'
        '[kinds.two]\nadapter = "openai"\nmodels = ["m"]\n'
        '[kinds.vectors]\nadapter = "openai"\nendpoint = "embeddings"\nmodels = ["m"]\n'
    )
    with pytest.raises(
        ConfigError, match=re.escape("kinds.two and kinds.one both serve model 'm'")
    ):
        load_settings(config)


def test_the_examples_of_docs_openai_load(tmp_path: Path) -> None:
    text = (DOCS / "openai.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", text, re.DOTALL)
    config = tmp_path / "openai.toml"
    config.write_text(block)
    settings = load_settings(config)
    assert served(settings)[("chat", "gpt-4o-mini")] == "chat"
    assert tomllib.loads(config.read_text())


@pytest.mark.parametrize(
    ("headers", "deadline", "expected"),
    [
        ({}, 900.0, 900.0),  # no timeout sent: the kind's deadline
        ({}, None, math.inf),
        ({"x-stainless-read-timeout": "600"}, 900.0, 570.0),  # 5 % margin
        ({"x-stainless-read-timeout": "4"}, 900.0, 3.5),  # at least half a second
        ({"x-stainless-read-timeout": "600"}, 60.0, 60.0),  # within the kind's deadline
        ({"x-stainless-read-timeout": "0.2"}, 60.0, 0.0),
        ({"x-stainless-read-timeout": "soon"}, 60.0, 60.0),  # unreadable: ignored
        ({"x-stainless-read-timeout": "nan"}, 60.0, 60.0),
    ],
)
def test_a_request_waits_within_the_clients_timeout_and_the_kinds_deadline(
    headers: dict[str, str], deadline: float | None, expected: float
) -> None:
    assert wait_budget(headers, deadline) == pytest.approx(expected)
