"""``GET /v1/models``: the simulator answers any model name; it lists a few."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from floodway.providers.sim.openai.calls import OpenAISimulator
from floodway.providers.sim.openai.wire import error, json_response

LISTED = ("gpt-4o-mini", "gpt-4o", "text-embedding-3-small", "dall-e-3")


def routes(sim: OpenAISimulator) -> list[Route]:
    return [Route("/v1/models", listed), Route("/v1/models/{model:path}", one)]


def _model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "floodway-simulator"}


async def listed(_: Request) -> Response:
    return json_response({"object": "list", "data": [_model(m) for m in LISTED]})


async def one(request: Request) -> Response:
    name = request.path_params["model"]
    if name not in LISTED:
        return error(404, f"The model '{name}' does not exist", code="model_not_found")
    return json_response(_model(name))
