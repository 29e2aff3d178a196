"""The model registry: models, versions, aliases, and their files. The work is
:mod:`trainhouse.usecases.models`'s; these routes parse, call and render.

Everyone signed in reads (viewers too); members and admins register, move aliases and delete
(members of their own models only); admins give a model to another user.
A job registers what it saved with its own credential (``POST /jobs/{id}/models``, what
``run.save_model`` calls).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Path
from fastapi.responses import StreamingResponse

from trainhouse.core.records import Job, ModelVersion
from trainhouse.server.auth import reporting_job, signed_in, writer
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import (
    AliasIn,
    ModelDetailOut,
    ModelListOut,
    ModelOut,
    ModelRegisterIn,
    ModelVersionOut,
    OwnerIn,
    VersionFromJobIn,
)
from trainhouse.server.schemas.models import PromotionRecordOut
from trainhouse.usecases import models
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["models"])

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ModelName = Annotated[str, Path(pattern=NAME, description="A model's name")]
AliasName = Annotated[str, Path(pattern=NAME, description="An alias: prod, staging, ...")]
Ref = Annotated[str, Path(pattern=NAME, description="A version number, an alias, or latest")]
VersionNo = Annotated[int, Path(ge=1, le=2**31 - 1)]
FileName = Annotated[str, Path(max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]


def version_out(v: ModelVersion) -> ModelVersionOut:
    data = asdict(v)
    data["aliases"] = list(v.aliases)
    data.pop("path")
    return ModelVersionOut(**data)


@router.post("/jobs/{job_id}/models", response_model=ModelVersionOut, status_code=201)
async def register_saved(
    body: ModelRegisterIn, job: Job = Depends(reporting_job), rt: Runtime = Depends(runtime)
) -> ModelVersionOut:
    """A model the job saved (``run.save_model``): checked and registered as a new version
    (its files hashed in the server's bounded background work; 503 with Retry-After when that
    is full, 422 for a model past the server's --model-max-bytes)."""
    return version_out(await models.register_saved(rt, job, body.path, name=body.name))


@router.get("/models", response_model=ModelListOut)
def list_models(_p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> ModelListOut:
    return ModelListOut(models=[ModelOut(**asdict(m)) for m in models.models(rt)])


@router.get("/models/{name}", response_model=ModelDetailOut)
def show_model(
    name: ModelName, _p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)
) -> ModelDetailOut:
    """A model with its versions (job, step, metrics, files, aliases), oldest first."""
    model, versions = models.detail(rt, name)
    promotions, readers = models.history(rt, name)
    return ModelDetailOut(
        model=ModelOut(**asdict(model)),
        versions=[version_out(v) for v in versions],
        promotions=[
            PromotionRecordOut(
                **{k: v for k, v in asdict(x).items() if k in PromotionRecordOut.model_fields}
            )
            for x in promotions
        ],
        readers={str(v): jobs for v, jobs in readers.items()},
    )


@router.get("/models/{name}/versions/{ref}", response_model=ModelVersionOut)
def show_version(
    name: ModelName,
    ref: Ref,
    _p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> ModelVersionOut:
    return version_out(models.version(rt, name, ref))


@router.post("/models/{name}/versions", response_model=ModelVersionOut, status_code=201)
async def register_version(
    body: VersionFromJobIn,
    name: ModelName,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> ModelVersionOut:
    """A job's saved model (its newest, or the one of ``step``) as a new version of ``name``;
    with ``loader``, the job's checkpoint (its newest, or the one of ``step``) copied as a
    model that function of the job's code rebuilds. The files are hashed (or the checkpoint
    copied) in the server's bounded background work: 503 with Retry-After when that is full,
    422 for a model past the server's --model-max-bytes."""
    inputs = [i.model_dump() for i in body.inputs] if body.inputs is not None else None
    made = await models.register(
        rt, p, name, body.job, step=body.step, loader=body.loader, inputs=inputs
    )
    return version_out(made)


@router.put("/models/{name}/aliases/{alias}", response_model=ModelVersionOut)
def set_alias(
    body: AliasIn,
    name: ModelName,
    alias: AliasName,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> ModelVersionOut:
    """Point ``alias`` at a version (made, or moved from the version it named)."""
    return version_out(models.set_alias(rt, p, name, alias, body.version))


@router.put("/models/{name}/owner", response_model=ModelOut)
def transfer(
    body: OwnerIn,
    name: ModelName,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> ModelOut:
    """Give the model to another user (admins only)."""
    return ModelOut(**asdict(models.transfer(rt, p, name, body.owner)))


@router.delete("/models/{name}/aliases/{alias}", status_code=204)
def remove_alias(
    name: ModelName,
    alias: AliasName,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> None:
    models.remove_alias(rt, p, name, alias)


@router.delete("/models/{name}/versions/{version}", response_model=ModelVersionOut)
def delete_version(
    name: ModelName,
    version: VersionNo,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> ModelVersionOut:
    """Forget a version and delete its files; refused (409) while an alias names it or a
    service uses it."""
    return version_out(models.delete_version(rt, p, name, version))


@router.get("/models/{name}/versions/{version}/files/{file}")
def version_file(
    name: ModelName,
    version: VersionNo,
    file: FileName,
    _p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> StreamingResponse:
    """One of a version's files, streamed (the client checks its sha256 against the record)."""
    return StreamingResponse(
        models.version_bytes(rt, name, version, file), media_type="application/octet-stream"
    )
