"""floodway's HTTP API: the app factory and its server helpers.

Imported on first use: a worker or a CLI command that never serves HTTP does not pay for
loading FastAPI and every route (about a second on a busy machine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from floodway.api.app import create_app
    from floodway.api.auth import check_bind
    from floodway.api.serve import run, serving, uvicorn_config

_HOMES = {
    "create_app": "floodway.api.app",
    "check_bind": "floodway.api.auth",
    "run": "floodway.api.serve",
    "serving": "floodway.api.serve",
    "uvicorn_config": "floodway.api.serve",
}

__all__ = ["check_bind", "create_app", "run", "serving", "uvicorn_config"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
