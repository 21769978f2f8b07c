"""Configuration: bad files stop start-up with a message naming the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from floodway import ConfigError
from floodway.config import load_settings, parse_duration, parse_rate


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "floodway.toml"
    path.write_text(text)
    return path


def test_full_example_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
database = "sqlite:///x.db"
[api]
keys = { "key-a" = "tenant-a" }
[resources.image-api]
concurrency = 10
requests_per_minute = 600
headroom = 0.8
adaptive = true
[tenants]
concurrency = 3
submit_rate = "1/10s"
interactive_depth = 5
[kinds.image]
adapter = "http"
resource = "image-api"
url = "http://127.0.0.1:9000/generate"
timeout = "60s"
deadline = "15m"
""",
    )
    s = load_settings(path)
    assert s.resources["image-api"].concurrency == 10
    assert s.kinds["image"].timeout == 60 and s.kinds["image"].deadline == 900
    assert s.api.keys == {"key-a": "tenant-a"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("bogus = 1\n", "bogus: unknown key"),
        ("[resources.llm]\nconcurrency = -1\n", "resources.llm.concurrency"),
        ("[resources.llm]\nconcurrency = 'ten'\n", "resources.llm.concurrency"),
        ("[resources.llm]\nheadroom = 1.5\n", "resources.llm.headroom"),
        ("[kinds.k]\nadapter = 'http'\nresource = 'nope'\n", "unknown resource 'nope'"),
        ("[kinds.k]\ntimeout = 'soon'\n", "kinds.k.timeout"),
        ("[tenants]\nsubmit_rate = 'fast'\n", "tenants.submit_rate"),
        ("[kinds.k]\nfallback = 'ghost'\n", "unknown kind 'ghost'"),
    ],
)
def test_bad_values_name_the_key_and_the_file(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(path) in str(info.value) and needle in str(info.value)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_settings(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(write(tmp_path, "database = \n"))


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOODWAY_DATABASE", "sqlite:///from-env.db")
    monkeypatch.setenv("FLOODWAY_RESOURCES__LLM__CONCURRENCY", "7")
    s = load_settings(
        write(tmp_path, 'database = "sqlite:///file.db"\n[resources.llm]\nconcurrency = 2\n')
    )
    assert s.database == "sqlite:///from-env.db"
    assert s.resources["llm"].concurrency == 7
    # explicit flags beat both
    assert load_settings(None, database="sqlite:///flag.db").database == "sqlite:///flag.db"


def test_durations_and_rates() -> None:
    assert parse_duration("250ms") == 0.25 and parse_duration("15m") == 900
    assert parse_duration(3) == 3.0
    assert parse_rate("1/10s") == (1.0, 10.0) and parse_rate("30/m") == (30.0, 60.0)
    with pytest.raises(ValueError):
        parse_duration("-1s")
    with pytest.raises(ValueError):
        parse_rate("0/s")


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        # a near miss of the README's image-api is offered as a variable spells it
        ("FLOODWAY_RESOURCES__IMAGE_APII__CONCURRENCY", "did you mean 'image_api'"),
        ("FLOODWAY_KINDS__CHAT__MAX_ATTEMPTS", "kind 'chat'"),
        ("FLOODWAY_TENANTS__ACME__BUDGET__AMOUNT", "tenant 'acme'"),
        ("FLOODWAY_API__NOPE", "api.nope is not a setting"),
        ("FLOODWAY_WORKER__CONCURENCY", "did you mean 'concurrency'"),
        ("FLOODWAY_RESOURCE__IMAGE_API__CONCURRENCY", "did you mean 'resources'"),
        ("FLOODWAY_RESOURCES__LLM__CONCURENCY", "did you mean 'concurrency'"),
    ],
)
def test_an_override_that_names_nothing_in_the_file_is_refused_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, expected: str
) -> None:
    path = write(tmp_path, "[resources.image-api]\nconcurrency = 10\n[resources.llm]\n")
    monkeypatch.setenv(variable, "2")
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    assert variable in str(refused.value) and expected in str(refused.value)


def test_a_variable_spells_a_name_with_a_dash_with_an_underscore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOODWAY_RESOURCES__IMAGE_API__CONCURRENCY", "2")
    monkeypatch.setenv("FLOODWAY_KINDS__IMAGE_GEN__MAX_ATTEMPTS", "7")
    s = load_settings(
        write(
            tmp_path,
            "[resources.image-api]\nconcurrency = 10\n"
            '[kinds.image-gen]\nadapter = "simulated"\nresource = "image-api"\n',
        )
    )
    assert set(s.resources) == {"image-api"} and s.resources["image-api"].concurrency == 2
    assert set(s.kinds) == {"image-gen"} and s.kinds["image-gen"].max_attempts == 7
    monkeypatch.delenv("FLOODWAY_KINDS__IMAGE_GEN__MAX_ATTEMPTS")
    s = load_settings(write(tmp_path, "[resources.image_api]\nconcurrency = 10\n"))
    assert s.resources["image_api"].concurrency == 2


def test_the_cli_s_own_variables_are_not_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOODWAY_URL", "http://127.0.0.1:8000")
    monkeypatch.setenv("FLOODWAY_API_KEY", "key-a")
    assert load_settings(write(tmp_path, "")).database


def test_a_near_miss_key_in_the_file_is_offered_and_a_bad_value_names_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"worker\.concurency: unknown key \(did you mean"):
        load_settings(write(tmp_path, "[worker]\nconcurency = 2\n"))
    with pytest.raises(ConfigError, match=r"resources\.llm\.headrom: unknown key \(did you"):
        load_settings(write(tmp_path, "[resources.llm]\nheadrom = 0.9\n"))
    monkeypatch.setenv("FLOODWAY_WORKER__CONCURRENCY", "many")
    with pytest.raises(ConfigError, match="the value of FLOODWAY_WORKER__CONCURRENCY"):
        load_settings(write(tmp_path, ""))


def test_a_table_set_from_the_environment_that_is_not_json_names_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOODWAY_API__KEYS", '{"key-a"="tenant-a"}')  # TOML's spelling
    with pytest.raises(ConfigError, match=r"^FLOODWAY_API__KEYS: cannot parse the value; .* JSON"):
        load_settings(write(tmp_path, ""))
