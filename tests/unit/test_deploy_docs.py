"""docs/deploy.md and the files beside it: every log line it quotes is one the code can print,
the compose file is valid YAML that wires every process the same way, the systemd units pass
``systemd-analyze verify``, and the TLS URLs it shows build a client."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from floodway.config import load_settings
from floodway.kinds import KindRegistry
from floodway.limits.redis_backend import RedisLimiterBackend
from floodway.providers.registry import aclose_kinds, build_provider_kind
from harness.processes import ROOT
from tests.logdocs import LINE, call_for, log_calls, quoted_lines

DEPLOY = ROOT / "docs" / "deploy.md"
FILES = ROOT / "docs" / "deploy"


def test_every_quoted_log_line_is_one_the_code_prints() -> None:
    lines = quoted_lines(DEPLOY.read_text())
    assert len(lines) >= 5
    calls = log_calls()
    for line in lines:
        assert LINE.match(line), f"not '<time> <logger> <message>': {line}"
        assert call_for(line, calls) is not None, f"no logging call prints: {line}"


def compose() -> dict[str, object]:
    loaded = yaml.safe_load((FILES / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


async def test_the_compose_file_runs_every_process_on_one_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = compose()["services"]
    assert isinstance(services, dict)
    assert set(services) >= {"postgres", "redis", "migrate", "worker", "api"}
    floodway = {n: s for n, s in services.items() if s.get("image") == "floodway:local"}
    assert set(floodway) >= {"migrate", "worker", "api", "simulator"}
    environments = {str(s["environment"]) for s in floodway.values()}
    assert len(environments) == 1  # one set of limits and one ledger for the whole fleet
    for name in ("migrate", "worker", "api"):
        command = floodway[name]["command"]
        assert command[0] == name and "/etc/floodway/floodway.toml" in command
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])
    assert "--appendonly" in services["redis"]["command"]
    assert (FILES / "Dockerfile").read_text().count("constraints.txt") == 1

    env = dict(floodway["api"]["environment"])
    env["FLOODWAY_API__KEYS"] = '{"change-me": "default"}'  # what compose interpolates
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(FILES / "floodway.toml")
    assert settings.database.startswith("postgresql://") and settings.redis.startswith("redis")
    registry = KindRegistry()
    for name, kind in settings.kinds.items():
        registry.add(build_provider_kind(name, kind))
    await aclose_kinds(registry)


@pytest.mark.parametrize(
    ("unit", "instance"),
    [
        ("floodway-api.service", "floodway-api.service"),
        ("floodway-worker@.service", "floodway-worker@1.service"),
    ],
)
def test_the_systemd_units_verify(unit: str, instance: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    floodway = Path(sys.executable).parent / "floodway"
    text = (FILES / unit).read_text()
    assert "ExecStart=/opt/floodway/venv/bin/floodway " in text
    # The one change: the floodway this test runs with, since /opt/floodway is not here.
    (tmp_path / instance).write_text(text.replace("/opt/floodway/venv/bin/floodway", str(floodway)))
    proc = subprocess.run(
        [analyze, "verify", str(tmp_path / instance)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def test_the_tls_urls_it_shows_build_clients() -> None:
    backend = RedisLimiterBackend.from_url(
        "rediss://:secret@redis.internal:6380/0?ssl_ca_certs=/etc/ssl/redis-ca.pem"
    )
    pool = backend.client.connection_pool
    assert pool.connection_class.__name__ == "SSLConnection"
    assert pool.connection_kwargs["ssl_ca_certs"] == "/etc/ssl/redis-ca.pem"
    await backend.aclose()
    assert "rediss://" in DEPLOY.read_text() and "sslmode=verify-full" in DEPLOY.read_text()
