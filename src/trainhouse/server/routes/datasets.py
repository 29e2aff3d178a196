"""Datasets: versions added from a URL or an uploaded directory, read, and removed. The work is
:mod:`trainhouse.usecases.datasets`'s; these routes parse, call and render.

Everyone signed in reads (viewers too); members add and remove versions of their own datasets;
admins all. A job's credential reads the manifests and files of the versions its job pins only
(what a node's supervisor stages).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Path, UploadFile
from fastapi.responses import StreamingResponse

from trainhouse.core.records import DatasetVersion
from trainhouse.server.auth import caller, signed_in, writer
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import (
    NO_NUL,
    DataCacheOut,
    DatasetAddOut,
    DatasetDetailOut,
    DatasetFileOut,
    DatasetListOut,
    DatasetOut,
    DatasetSourceIn,
    DatasetVersionOut,
    ManifestOut,
)
from trainhouse.usecases import datasets
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["datasets"])

Name = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
VersionNo = Annotated[int, Path(ge=1, le=2**31 - 1)]
FilePath = Annotated[str, Path(min_length=1, max_length=1024, pattern=NO_NUL)]


def version_out(v: DatasetVersion, jobs: list[int] | None = None) -> DatasetVersionOut:
    return DatasetVersionOut(**asdict(v), ref=v.ref, jobs=jobs or [])


@router.get("/datasets", response_model=DatasetListOut)
def list_datasets(
    _p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)
) -> DatasetListOut:
    return DatasetListOut(datasets=[DatasetOut(**asdict(d)) for d in datasets.datasets(rt)])


@router.get("/datacache", response_model=DataCacheOut)
def data_cache(_p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> DataCacheOut:
    """What the server machine's cache of staged dataset versions holds."""
    return DataCacheOut(**datasets.cache_usage(rt))


@router.post("/datasets/{name}/versions", response_model=DatasetAddOut, status_code=201)
def add_source(
    body: DatasetSourceIn,
    name: Name,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> DatasetAddOut:
    """The files under a URL as a new version (listed, hashed where the store gives no
    checksum; copied into the server's storage with ``copy``)."""
    made, new = datasets.add_source(
        rt,
        p,
        name,
        body.source,
        storage_options=body.storage_options,
        description=body.description,
        copy=body.copy_,
    )
    return DatasetAddOut(version=version_out(made), new=new)


@router.post("/datasets/{name}/upload", response_model=DatasetAddOut, status_code=201)
def add_upload(
    name: Name,
    archive: Annotated[UploadFile, File(description="The directory as a .tar.gz archive")],
    description: Annotated[str | None, Form(max_length=4096, pattern=NO_NUL)] = None,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> DatasetAddOut:
    """An uploaded directory as a new version, kept in the server's dataset storage."""
    made, new = datasets.add_upload(rt, p, name, archive.file, description=description)
    return DatasetAddOut(version=version_out(made), new=new)


@router.get("/datasets/{name}", response_model=DatasetDetailOut)
def show(
    name: Name, _p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)
) -> DatasetDetailOut:
    found, versions = datasets.detail(rt, name)
    used = datasets.users_by_version(rt, name)
    return DatasetDetailOut(
        dataset=DatasetOut(**asdict(found)),
        versions=[version_out(v, used.get(v.version)) for v in versions],
        jobs=datasets.users(rt, name),
    )


@router.get("/datasets/{name}/versions/{version}", response_model=DatasetVersionOut)
def show_version(
    name: Name,
    version: VersionNo,
    _p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> DatasetVersionOut:
    return version_out(datasets.version(rt, name, version), datasets.users(rt, name, version))


@router.get("/datasets/{name}/versions/{version}/manifest", response_model=ManifestOut)
def manifest(
    name: Name, version: VersionNo, p: Principal = Depends(caller), rt: Runtime = Depends(runtime)
) -> ManifestOut:
    """Every file of a version: path, size, digest (a job's credential: its pins only)."""
    found, listed = datasets.manifest(rt, p, name, version)
    return ManifestOut(
        ref=found.ref,
        digest=found.digest,
        files=[DatasetFileOut(**f.to_json()) for f in listed.files],
    )


@router.get("/datasets/{name}/versions/{version}/files/{path:path}")
def file(
    name: Name,
    version: VersionNo,
    path: FilePath,
    p: Principal = Depends(caller),
    rt: Runtime = Depends(runtime),
) -> StreamingResponse:
    """One file of a version the server holds (a job's credential: its pins only)."""
    entry, chunks = datasets.file_bytes(rt, p, name, version, path)
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"Content-Length": str(entry.size), "X-Trainhouse-Digest": entry.key},
    )


@router.delete("/datasets/{name}/versions/{version}", response_model=DatasetVersionOut)
def remove(
    name: Name, version: VersionNo, p: Principal = Depends(writer), rt: Runtime = Depends(runtime)
) -> DatasetVersionOut:
    """Forget a version; 409 naming the job while a queued or running job pins it."""
    return version_out(datasets.remove(rt, p, name, version))
