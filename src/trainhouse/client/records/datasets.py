"""Records of datasets: versions, manifests, the list.

TypedDicts, no ``from __future__ import annotations``: see :mod:`trainhouse.client.records`."""

from typing import TypedDict

__all__ = [
    "CachedVersion",
    "DataCache",
    "Dataset",
    "DatasetAdded",
    "DatasetDetail",
    "DatasetFile",
    "DatasetList",
    "DatasetPin",
    "DatasetVersion",
    "Manifest",
]


class DatasetVersion(TypedDict):
    """``DatasetVersionOut``: a version of a dataset."""

    dataset: str
    version: int
    ref: str
    digest: str
    source: str | None
    storage_options: dict[str, str]
    files: int
    size: int
    checksums: str
    description: str | None
    created_by: str
    created_at: float
    jobs: list[int]


class DatasetAdded(TypedDict):
    """``DatasetAddOut``: the version an add gave, and whether it is new."""

    version: DatasetVersion
    new: bool


class Dataset(TypedDict):
    """``DatasetOut``: a dataset."""

    name: str
    owner: str
    created_at: float
    versions: int
    latest: int | None
    size: int | None


class DatasetList(TypedDict):
    """``DatasetListOut``."""

    datasets: list[Dataset]


class DatasetDetail(TypedDict):
    """``DatasetDetailOut``: a dataset, its versions and the jobs that pinned it."""

    dataset: Dataset
    versions: list[DatasetVersion]
    jobs: list[int]


class DatasetPin(TypedDict):
    """``PinOut``: a dataset version a job reads under ``key``."""

    key: str
    name: str
    version: int
    digest: str
    ref: str


class CachedVersion(TypedDict):
    """``CachedVersionOut``: a version staged in a node's cache."""

    digest: str
    refs: list[str]
    size: int
    last_used: float
    in_use: bool


class DataCache(TypedDict):
    """``DataCacheOut``: a node's cache of staged dataset versions."""

    node: str
    bytes: int
    limit: int
    versions: list[CachedVersion]


class DatasetFile(TypedDict):
    """``DatasetFileOut``: one file of a version."""

    path: str
    size: int
    algorithm: str
    digest: str


class Manifest(TypedDict):
    """``ManifestOut``: every file of a version."""

    ref: str
    digest: str
    files: list[DatasetFile]
