"""Validated settings from a TOML file and ``FLOODWAY_...`` environment variables.

An unknown key, a wrong type or an impossible value stops start-up with a
:class:`~floodway.core.errors.ConfigError` that names the key and the file.
Environment variables win over the file; nested keys use ``__``
(``FLOODWAY_RESOURCES__LLM__CONCURRENCY=8``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from floodway.core.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(value: Any) -> float:
    """``"90s"``, ``"15m"``, ``"24h"``, ``"7d"``, ``"250ms"`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '15m'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise ValueError(f"{value!r} is not a duration (use e.g. '500ms', '60s', '15m', '24h')")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def parse_rate(value: str) -> tuple[float, float]:
    """``"1/10s"`` -> (1 request, per 10 seconds). Empty -> (0, 0) = no limit."""
    if not value:
        return (0.0, 0.0)
    count, _, per = value.partition("/")
    try:
        n = float(count)
        seconds = parse_duration(per if per[:1].isdigit() else f"1{per}")
    except (ValueError, IndexError) as exc:
        raise ValueError(f"{value!r} is not a rate (use e.g. '1/10s', '30/m')") from exc
    if n <= 0 or seconds <= 0:
        raise ValueError(f"{value!r}: a rate needs a positive count and period")
    return (n, seconds)


def _check_rate(value: str) -> str:
    parse_rate(value)
    return value


Rate = Annotated[str, BeforeValidator(_check_rate)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResourceConfig(_Strict):
    """One provider quota pool. Limits are the provider's published ones; floodway applies
    ``headroom`` of them. 0 means no limit on that dimension."""

    concurrency: int = Field(0, ge=0)
    requests_per_minute: float = Field(0, ge=0)
    tokens_per_minute: float = Field(0, ge=0)
    headroom: float = Field(1.0, gt=0, le=1)
    adaptive: bool = False
    burst: Duration = Field(0.0, description="bucket capacity as seconds of refill; 0 = auto")


class TenantConfig(_Strict):
    concurrency: int = Field(0, ge=0)
    submit_rate: Rate = ""
    interactive_depth: int = Field(5, ge=0)


class ApiConfig(_Strict):
    keys: dict[str, str] = Field(default_factory=dict)
    max_body_bytes: int = Field(1_048_576, gt=0)
    max_json_depth: int = Field(32, gt=0)
    #: hosts a task's ``callback_url`` may name (``hooks.example.com``, ``*.example.com``);
    #: empty = any. Set it when callers are not trusted: the outbox POSTs from inside your
    #: network, so an open list lets a caller aim it at internal addresses (SSRF).
    callback_hosts: list[str] = Field(default_factory=list)


class RetentionConfig(_Strict):
    results: Duration = 7 * 86400
    rows: Duration = 30 * 86400
    keys: Duration = 24 * 3600


class KindConfig(_Strict):
    adapter: Literal["http", "openai", "simulated", "python"] = "python"
    resource: str | None = None
    handler: str | None = None  # python adapter: "module:function"
    url: str | None = None
    poll_url: str | None = None
    cancel_url: str | None = None
    lookup_url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    status_field: str = "status"
    done_values: list[str] = Field(default_factory=lambda: ["succeeded", "completed", "done"])
    failed_values: list[str] = Field(default_factory=lambda: ["failed", "error", "cancelled"])
    result_field: str = "result"
    id_field: str = "id"
    webhook_secret: str | None = None
    base_url: str | None = None  # openai
    api_key_env: str | None = None  # openai
    endpoint: Literal["chat", "embeddings", "images"] = "chat"
    model: str | None = None
    cost: str | None = None  # "tokens" | "chars" | "fixed:N" ...
    output_schema: dict[str, Any] | None = None
    fallback: str | None = None
    max_attempts: int = Field(4, ge=1)
    timeout: Duration = 60.0
    deadline: Duration = 15 * 60.0
    dedupe: bool = True
    version: str = "1"
    #: first poll of an upstream job; None: learned from the kind's recent jobs
    poll_after: Duration | None = None
    poll_max_attempts: int = Field(30, ge=1)
    callback_grace: Duration = 180.0
    options: dict[str, Any] = Field(default_factory=dict)  # adapter-specific extras


class WorkerConfig(_Strict):
    concurrency: int = Field(20, ge=1)
    lease: Duration = 30.0
    grace: Duration = 10.0
    claim_batch: int = Field(64, ge=1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLOODWAY_", env_nested_delimiter="__", extra="forbid"
    )

    database: str = "sqlite:///floodway.db"
    redis: str = ""
    #: one deployment's keys in a shared Redis: ``floodway:{<redis_prefix>}:...``
    redis_prefix: str = Field("default", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    alert_url: str = ""
    api: ApiConfig = Field(default_factory=ApiConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    tenants: TenantConfig = Field(default_factory=TenantConfig)
    resources: dict[str, ResourceConfig] = Field(default_factory=dict)
    kinds: dict[str, KindConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _kinds_name_known_resources(self) -> Settings:
        for name, kind in self.kinds.items():
            if kind.resource and kind.resource not in self.resources:
                known = ", ".join(sorted(self.resources)) or "none configured"
                raise ValueError(
                    f"kinds.{name}.resource names unknown resource {kind.resource!r}"
                    f" (known: {known})"
                )
            if kind.fallback and kind.fallback not in self.kinds:
                raise ValueError(f"kinds.{name}.fallback names unknown kind {kind.fallback!r}")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit arguments (CLI flags) > environment > file (passed in as init values).
        return (env_settings, init_settings)


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read ``path`` (TOML) if given, apply env and non-None ``overrides``, validate."""
    data: dict[str, Any] = {}
    where = str(path) if path else "environment"
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, where)) from None
    # Env values would otherwise beat explicit overrides; the caller's flags win.
    return settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def format_validation_error(exc: ValidationError, where: str) -> str:
    lines = [f"invalid configuration in {where}:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)
