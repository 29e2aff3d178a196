"""The bodies of the datasets routes: adding a version from a URL, a version, a dataset, the
list, a manifest."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from trainhouse.server.schemas.common import INT32, INT64, NO_NUL

DatasetName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class DatasetSourceIn(BaseModel):
    """``trainhouse datasets add NAME URL``: the files under a URL fsspec reads (``s3://``,
    ``gs://``, ``az://``, ``http(s)://``, ``file://`` on a shared file system, ``hdfs://``)."""

    source: str = Field(min_length=1, max_length=2048, pattern=NO_NUL)
    storage_options: dict[
        Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")],
        Annotated[str, Field(max_length=1024, pattern=NO_NUL)],
    ] = Field(default_factory=dict, max_length=32)
    description: str | None = Field(None, max_length=4096, pattern=NO_NUL)
    copy_: bool = Field(False, alias="copy", description="copy the files into the server's storage")


class DatasetVersionOut(BaseModel):
    dataset: DatasetName
    version: int = Field(ge=1, le=INT32)
    ref: str
    digest: str
    source: str | None = Field(description="None: the server's dataset storage")
    storage_options: dict[str, str]
    files: int = Field(ge=0, le=INT64)
    size: int = Field(ge=0, le=INT64)
    checksums: str = Field(description="how its files' digests were had: sha256 (hashed), md5")
    description: str | None
    created_by: str
    created_at: float
    jobs: list[int] = Field(default_factory=list, description="jobs that pinned it, newest first")


class DatasetAddOut(BaseModel):
    version: DatasetVersionOut
    new: bool = Field(description="false: the name already had this content, as this version")


class DatasetOut(BaseModel):
    name: DatasetName
    owner: str
    created_at: float
    versions: int
    latest: int | None
    size: int | None = Field(description="the newest version's bytes")


class DatasetListOut(BaseModel):
    datasets: list[DatasetOut]


class DatasetDetailOut(BaseModel):
    dataset: DatasetOut
    versions: list[DatasetVersionOut]
    jobs: list[int] = Field(description="jobs that pinned any version, newest first")


class PinOut(BaseModel):
    """A dataset version a job reads under ``key``, pinned at submit."""

    key: str
    name: str
    version: int = Field(ge=1, le=INT32)
    digest: str
    ref: str


class CachedVersionOut(BaseModel):
    digest: str
    refs: list[str] = Field(description="the versions this manifest is (NAME@N)")
    size: int = Field(ge=0, le=INT64)
    last_used: float
    in_use: bool


class DataCacheOut(BaseModel):
    """A node's cache of staged dataset versions."""

    node: str
    bytes: int = Field(ge=0, le=INT64, description="every object once, linked or not")
    limit: int = Field(ge=0, le=INT64, description="--dataset-cache-bytes (0: none)")
    versions: list[CachedVersionOut] = Field(description="least recently used first")


class DatasetFileOut(BaseModel):
    path: str
    size: int = Field(ge=0, le=INT64)
    algorithm: str
    digest: str


class ManifestOut(BaseModel):
    ref: str
    digest: str
    files: list[DatasetFileOut]
