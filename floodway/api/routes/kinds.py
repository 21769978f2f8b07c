"""``GET /v1/kinds``: the kinds this server runs, for a caller who needs a kind's name (the
configuration is the operator's; what a kind is called and how it is limited is no tenant's
secret)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from floodway.api.auth import Tenant
from floodway.api.openapi import problems
from floodway.api.state import ApiState, api_state

router = APIRouter(prefix="/v1/kinds", tags=["kinds"])
State = Annotated[ApiState, Depends(api_state)]


class KindOut(BaseModel):
    name: str
    resource: str | None = Field(description="the resource whose limits it runs inside")
    max_attempts: int
    deadline_s: float | None
    timeout_s: float | None
    models: list[str] = Field(description="the models /openai/v1 routes to it")


class KindsOut(BaseModel):
    kinds: list[KindOut]


@router.get("", response_model=KindsOut, summary="List kinds", responses=problems(401))
async def list_kinds(tenant: Tenant, state: State) -> KindsOut:
    configured = state.settings.kinds
    return KindsOut(
        kinds=[
            KindOut(
                name=spec.name,
                resource=spec.resource,
                max_attempts=spec.max_attempts,
                deadline_s=spec.deadline_s,
                timeout_s=spec.timeout_s,
                models=configured[spec.name].served_models if spec.name in configured else [],
            )
            for spec in sorted(state.fw.kinds.specs(), key=lambda s: s.name)
        ]
    )
