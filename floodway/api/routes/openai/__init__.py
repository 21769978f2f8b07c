"""The OpenAI-compatible API under ``/openai/v1`` (docs/openai.md). Its errors are RFC 9457
problems that also carry OpenAI's ``error`` object, which the official SDKs read."""

from __future__ import annotations

from fastapi import APIRouter

from floodway.api.routes.openai import batches, endpoints, files, responses
from floodway.api.routes.openai.endpoints import DIRECT, PREFIX

#: uploads may be larger than other bodies ([api] max_file_bytes)
FILES_PATH = PREFIX + "/files"

# OpenAI's API reference describes these routes; floodway's OpenAPI document keeps to its own.
router = APIRouter(prefix=PREFIX, tags=["openai"], include_in_schema=False)
for module in (endpoints, responses, files, batches):
    router.include_router(module.router)

__all__ = ["DIRECT", "FILES_PATH", "PREFIX", "router"]
