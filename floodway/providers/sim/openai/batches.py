"""OpenAI's Files and Batch API, as the simulator serves them: upload a JSONL file of requests
(``purpose = "batch"``), create a batch of it (with ``metadata``), retrieve, list, cancel, and
download its output and error files.

A batch holds for ``hold_s`` (settable: :attr:`BatchDesk.hold_s`, ``--batch-hold``): its lines
are answered one after another over that time, line ``i`` of ``n`` at ``(i + 1) / n`` of it,
so a batch cancelled halfway has answered about half its lines, which are in its output file
and billed; the others are not. Each answered line is billed at the batch price (half the
sync price, as OpenAI does) in the desk's own charge ledger (``GET /ledger``'s ``batch``),
apart from the sync calls' ledger. A line whose body has ``metadata.fail = "5xx"`` fails with
a 500 in the error file, ``"refusal"`` with a 400; neither is billed. Time is read from the
simulator's clock (``OpenAISimulator.clock``), so a test's fake clock moves the batches too.
The ledger also says the most lines the desk held enqueued at once (in batches not ended):
what a provider's batch queue limit counts.
"""

from __future__ import annotations

import json
from functools import partial

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from floodway.providers.sim.openai.calls import OpenAISimulator
from floodway.providers.sim.openai.chat import whole_completion
from floodway.providers.sim.openai.desk import MAX_LINES, Batch, BatchDesk, LineAnswer
from floodway.providers.sim.openai.embeddings import whole_embedding
from floodway.providers.sim.openai.wire import error, json_response

#: the endpoints a batch may run, and how a line's body is answered
LINE_ENDPOINTS: dict[str, LineAnswer] = {
    "/v1/chat/completions": whole_completion,
    "/v1/embeddings": whole_embedding,
}


def routes(sim: OpenAISimulator) -> list[Route]:
    desk = sim.batches
    desk.answers.update(LINE_ENDPOINTS)
    return [
        Route("/v1/files", partial(upload, desk), methods=["POST"]),
        Route("/v1/files/{file_id}", partial(get_file, desk), methods=["GET"]),
        Route("/v1/files/{file_id}/content", partial(file_content, desk), methods=["GET"]),
        Route("/v1/batches", partial(create, desk), methods=["POST"]),
        Route("/v1/batches", partial(list_batches, desk), methods=["GET"]),
        Route("/v1/batches/{batch_id}", partial(retrieve, desk), methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", partial(cancel, desk), methods=["POST"]),
    ]


def _not_found(what: str, name: str) -> Response:
    return error(404, f"No such {what}: {name}", code="not_found")


async def upload(desk: BatchDesk, request: Request) -> Response:
    form = await request.form()
    upload_ = form.get("file")
    purpose = form.get("purpose")
    if not isinstance(upload_, UploadFile):
        return error(400, "file is required", param="file")
    if purpose != "batch":
        return error(400, "purpose must be 'batch'", param="purpose")
    content = await upload_.read()
    file_id = desk.add_file("batch", upload_.filename or "input.jsonl", content)
    return json_response(desk.files[file_id][0])


async def get_file(desk: BatchDesk, request: Request) -> Response:
    found = desk.files.get(request.path_params["file_id"])
    return (
        _not_found("file", request.path_params["file_id"])
        if found is None
        else json_response(found[0])
    )


async def file_content(desk: BatchDesk, request: Request) -> Response:
    found = desk.files.get(request.path_params["file_id"])
    if found is None:
        return _not_found("file", request.path_params["file_id"])
    return Response(found[1], media_type="application/octet-stream")


async def create(desk: BatchDesk, request: Request) -> Response:
    try:
        body = json.loads(await request.body())
    except ValueError:
        return error(400, "We could not parse the JSON body of your request.")
    if not isinstance(body, dict):
        return error(400, "The request body must be a JSON object.")
    endpoint = body.get("endpoint")
    if endpoint not in LINE_ENDPOINTS:
        return error(400, f"endpoint must be one of {', '.join(LINE_ENDPOINTS)}", param="endpoint")
    found = desk.files.get(str(body.get("input_file_id")))
    if found is None:
        return error(400, "input_file_id names no file", param="input_file_id")
    try:
        lines = [json.loads(line) for line in found[1].decode().splitlines() if line.strip()]
    except ValueError:
        return error(400, "the input file is not JSONL", param="input_file_id")
    if not lines or len(lines) > MAX_LINES:
        return error(400, f"a batch holds 1 to {MAX_LINES} requests", param="input_file_id")
    if len({str(line.get("custom_id")) for line in lines}) != len(lines):
        return error(400, "custom_id must be unique within a batch", param="input_file_id")
    metadata = body.get("metadata")
    batch = Batch(
        id=OpenAISimulator.new_id("batch"),
        input_file_id=found[0]["id"],
        endpoint=endpoint,
        completion_window=str(body.get("completion_window", "24h")),
        metadata=metadata if isinstance(metadata, dict) else None,
        created_at=desk.clock(),
        lines=lines,
    )
    desk.enqueue(batch)
    return json_response(batch.as_dict())


def _batch(desk: BatchDesk, request: Request) -> Batch | None:
    batch = desk.batches.get(request.path_params["batch_id"])
    if batch is not None:
        desk.advance(batch)
    return batch


async def retrieve(desk: BatchDesk, request: Request) -> Response:
    batch = _batch(desk, request)
    if batch is None:
        return _not_found("batch", request.path_params["batch_id"])
    return json_response(batch.as_dict())


async def cancel(desk: BatchDesk, request: Request) -> Response:
    batch = _batch(desk, request)
    if batch is None:
        return _not_found("batch", request.path_params["batch_id"])
    desk.cancel(batch)
    return json_response(batch.as_dict())


async def list_batches(desk: BatchDesk, request: Request) -> Response:
    """Newest first, ``limit`` (default 20, at most 100) after the id ``after``."""
    try:
        limit = max(1, min(100, int(request.query_params.get("limit", "20"))))
    except ValueError:
        return error(400, "limit must be a whole number", param="limit")
    ids = list(reversed(desk.created))
    after = request.query_params.get("after")
    if after in ids:
        ids = ids[ids.index(after) + 1 :]
    page = ids[:limit]
    for batch_id in page:
        desk.advance(desk.batches[batch_id])
    data = [desk.batches[i].as_dict() for i in page]
    return json_response(
        {
            "object": "list",
            "data": data,
            "first_id": page[0] if page else None,
            "last_id": page[-1] if page else None,
            "has_more": len(ids) > limit,
        }
    )
