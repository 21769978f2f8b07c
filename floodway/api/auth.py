"""Tenants from API keys, and the rule that an open API only listens on loopback."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from floodway.api.problems import ApiProblem
from floodway.api.state import ApiState, api_state
from floodway.config import Settings
from floodway.core.errors import ConfigError

OPEN_TENANT = "default"

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="the API key")


@dataclass(frozen=True)
class Caller:
    """Who calls: the tenant every task read and write is scoped to, and whether the key is an
    operator's (``[api] admin_keys``): operators see every tenant's statistics and metrics."""

    tenant: str
    operator: bool = False


def is_open(settings: Settings) -> bool:
    return not settings.api.keys and not settings.api.admin_keys


async def caller(
    request: Request,
    state: Annotated[ApiState, Depends(api_state)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> Caller:
    return identify(request, state, bearer, api_key)


async def caller_of(request: Request) -> Caller:
    """``caller`` for a direct route (floodway.api.direct): the same headers, read here."""
    return identify(
        request, await api_state(request), await _bearer(request), await _api_key(request)
    )


def identify(
    request: Request,
    state: ApiState,
    bearer: HTTPAuthorizationCredentials | None,
    api_key: str | None,
) -> Caller:
    settings = state.settings
    if is_open(settings):  # bound to loopback: whoever reaches it runs this host
        return Caller(OPEN_TENANT, operator=True)
    presented = bearer.credentials if bearer is not None else api_key
    owner = state.keys.owner(presented) if presented else None
    if owner is None:
        raise ApiProblem(
            401,
            "unauthorized",
            "missing API key" if not presented else "unknown API key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    request.state.tenant = owner.tenant
    return Caller(owner.tenant, operator=owner.operator)


async def caller_tenant(who: Annotated[Caller, Depends(caller)]) -> str:
    """Every task read and write is scoped to this tenant."""
    return who.tenant


async def operator(who: Annotated[Caller, Depends(caller)]) -> Caller:
    if not who.operator:
        raise ApiProblem(
            403, "forbidden", "this needs an operator key ([api] admin_keys in the configuration)"
        )
    return who


Tenant = Annotated[str, Depends(caller_tenant)]
Who = Annotated[Caller, Depends(caller)]
Operator = Annotated[Caller, Depends(operator)]


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name could resolve anywhere: assume it is reachable


def check_bind(host: str, settings: Settings) -> None:
    """Refuse to serve an open API (no keys) on anything but loopback."""
    if not is_open(settings) or is_loopback(host):
        return
    raise ConfigError(
        f"refusing to bind {host} with no API keys configured: anyone who can reach it could "
        'submit billed work. Add [api] keys = { "<key>" = "<tenant>" } to the config '
        "(or FLOODWAY_API__KEYS), or bind 127.0.0.1."
    )
