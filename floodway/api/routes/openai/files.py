"""``/openai/v1/files``: the JSONL inputs of batches, and the output and error files floodway
writes when a batch ends. Files live in the ledger, per tenant: another tenant's file id is a
404, as is an id that never existed."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, NoReturn

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from floodway.api.auth import Tenant
from floodway.api.guard import json_too_deep
from floodway.api.problems import ApiProblem
from floodway.api.state import ApiState, api_state
from floodway.core.task import new_id
from floodway.store.base import StoredFile
from floodway.wire.openai import list_page
from floodway.wire.tasks import valid_unicode

router = APIRouter()

State = Annotated[ApiState, Depends(api_state)]

#: OpenAI's own limit on the requests of one batch
MAX_REQUESTS = 50_000
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: not kept in a file name (PostgreSQL's text cannot even hold NUL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def file_object(file: StoredFile) -> dict[str, Any]:
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": int(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


class _NotJson(Exception):
    pass


def _not_json(constant: str) -> NoReturn:
    """``NaN``, ``Infinity`` and ``-Infinity``: Python's parser reads them, JSON has none."""
    raise _NotJson(constant)


def jsonl_lines(content: bytes, max_depth: int) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line; a 400 naming the first bad line. A line
    is held to ``[api] max_json_depth`` as a JSON body is (before any parser recurses)."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiProblem(400, "invalid-file", "the file is not UTF-8 text", param="file") from None
    lines: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if json_too_deep(line.encode(), max_depth):
            raise ApiProblem(
                400,
                "invalid-file",
                f"line {number} nests deeper than {max_depth} levels (max_json_depth)",
                param="file",
                line=number,
            )
        try:
            value = json.loads(line, parse_constant=_not_json)
        except _NotJson as exc:
            raise ApiProblem(
                400,
                "invalid-file",
                f"line {number} holds {exc}, which JSON does not allow (Python's json.dumps "
                "writes it unless allow_nan=False)",
                param="file",
                line=number,
            ) from None
        except ValueError:
            raise ApiProblem(
                400, "invalid-file", f"line {number} is not JSON", param="file", line=number
            ) from None
        if not isinstance(value, dict) or not valid_unicode(value):
            raise ApiProblem(
                400,
                "invalid-file",
                f"line {number} is not a JSON object of Unicode text",
                param="file",
                line=number,
            )
        lines.append((number, value))
    if not lines:
        raise ApiProblem(400, "invalid-file", "the file has no requests", param="file")
    if len(lines) > MAX_REQUESTS:
        raise ApiProblem(
            400,
            "invalid-file",
            f"the file has {len(lines)} requests; a batch takes at most {MAX_REQUESTS}",
            param="file",
        )
    return lines


async def tenant_file(state: ApiState, file_id: str, tenant: str) -> StoredFile:
    found = (
        await state.fw.openai_records.get_file(file_id, tenant) if _ID.fullmatch(file_id) else None
    )
    if found is None:
        raise ApiProblem(404, "file-not-found", f"no file {file_id[:64]!r}", param="file_id")
    return found


@router.post("/files")
async def upload(request: Request, tenant: Tenant, state: State) -> dict[str, Any]:
    """multipart/form-data with ``file`` (JSONL, one request a line) and ``purpose=batch``."""
    form = await request.form(max_files=1, max_fields=8)
    upload, purpose = form.get("file"), form.get("purpose")
    if purpose != "batch":
        raise ApiProblem(
            400,
            "invalid-purpose",
            "purpose must be 'batch' (the files floodway keeps are batch inputs)",
            param="purpose",
        )
    if not isinstance(upload, UploadFile):
        raise ApiProblem(400, "file-missing", "send the file as the multipart field 'file'")
    content = await upload.read()
    # A file no batch could read is refused now, not at batch creation.
    jsonl_lines(content, state.settings.api.max_json_depth)
    now = state.fw.clock.now()
    stored = StoredFile(
        id=new_id(now, prefix="file"),
        tenant=tenant,
        purpose="batch",
        filename=_CONTROL.sub("", upload.filename or "")[:255] or "batch.jsonl",
        bytes=len(content),
        created_at=now,
    )
    await state.fw.openai_records.put_file(stored, content)
    return file_object(stored)


@router.get("/files")
async def list_files(
    tenant: Tenant,
    state: State,
    purpose: Annotated[str | None, Query(max_length=64, pattern=_ID.pattern)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: Annotated[str | None, Query(max_length=64, pattern=_ID.pattern)] = None,
) -> dict[str, Any]:
    """The tenant's files, newest first (the ``order`` OpenAI defaults to)."""
    found = await state.fw.openai_records.list_files(tenant, purpose, after, limit + 1)
    return list_page([file_object(f) for f in found[:limit]], len(found) > limit)


@router.get("/files/{file_id}")
async def get_file(file_id: str, tenant: Tenant, state: State) -> dict[str, Any]:
    return file_object(await tenant_file(state, file_id, tenant))


@router.get("/files/{file_id}/content")
async def file_content(file_id: str, tenant: Tenant, state: State) -> Response:
    found = await tenant_file(state, file_id, tenant)
    content = await state.fw.openai_records.file_content(found.id, tenant)
    if content is None:
        raise ApiProblem(404, "file-not-found", f"no file {file_id[:64]!r}", param="file_id")
    return Response(content, media_type="application/octet-stream")


@router.delete("/files/{file_id}")
async def delete_file(file_id: str, tenant: Tenant, state: State) -> dict[str, Any]:
    found = await tenant_file(state, file_id, tenant)
    await state.fw.openai_records.delete_file(found.id, tenant)
    return {"id": found.id, "object": "file", "deleted": True}
