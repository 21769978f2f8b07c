"""Tenants from API keys, and the rule that an open API only listens on loopback."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from floodway.api.problems import ApiProblem
from floodway.api.state import ApiState, api_state
from floodway.config import Settings
from floodway.core.errors import ConfigError

OPEN_TENANT = "default"
#: the outbound-webhook signing secret when no API keys are configured
OPEN_SIGNING_SECRET = "floodway"

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="the API key")


def tenant_for_key(keys: dict[str, str], presented: str) -> str | None:
    """The tenant of ``presented``; compares against every key so timing tells nothing."""
    found = None
    for key, tenant in keys.items():
        if hmac.compare_digest(key.encode(), presented.encode()):
            found = tenant
    return found


async def caller_tenant(
    request: Request,
    state: Annotated[ApiState, Depends(api_state)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> str:
    """Every task read and write is scoped to this tenant."""
    keys = state.settings.api.keys
    if not keys:
        return OPEN_TENANT
    presented = bearer.credentials if bearer is not None else api_key
    tenant = tenant_for_key(keys, presented) if presented else None
    if tenant is None:
        raise ApiProblem(
            401,
            "unauthorized",
            "missing API key" if not presented else "unknown API key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    request.state.tenant = tenant
    return tenant


Tenant = Annotated[str, Depends(caller_tenant)]


def signing_secret(settings: Settings, tenant: str) -> str:
    """The secret that signs a tenant's outbound webhooks: its API key (the first in sorted
    order when it has several), or ``"floodway"`` when the API is open."""
    own = sorted(key for key, owner in settings.api.keys.items() if owner == tenant)
    return own[0] if own else OPEN_SIGNING_SECRET


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name could resolve anywhere: assume it is reachable


def check_bind(host: str, settings: Settings) -> None:
    """Refuse to serve an open API (no keys) on anything but loopback."""
    if settings.api.keys or is_loopback(host):
        return
    raise ConfigError(
        f"refusing to bind {host} with no API keys configured: anyone who can reach it could "
        'submit billed work. Add [api] keys = { "<key>" = "<tenant>" } to the config '
        "(or FLOODWAY_API__KEYS), or bind 127.0.0.1."
    )
