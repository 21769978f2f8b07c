"""floodway's HTTP API: the app factory and its server helpers."""

from floodway.api.app import create_app
from floodway.api.auth import check_bind
from floodway.api.serve import run, serving, uvicorn_config

__all__ = ["check_bind", "create_app", "run", "serving", "uvicorn_config"]
