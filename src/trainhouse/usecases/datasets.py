"""Datasets: registering versions, reading them, removing them, and what a job's nodes stage.

Everyone signed in reads (viewers too); members add versions to their own datasets (a new name
is theirs) and remove their own versions; admins do anything. A job's credential reads only the
versions its job pins (their manifests, and the files the server holds). Each write is audited
in the transaction of the change.

A version's source is either the server's dataset storage (an uploaded directory; ``--copy``)
or a URL that fsspec reads, with storage options; the credentials to read it are the server's
and the nodes' own environment's (the ``AWS_*`` variables, ``~/.aws``), never the request's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

from trainhouse.core.datasets import (
    FileEntry,
    Manifest,
    check_name,
    check_path,
)
from trainhouse.core.errors import DatasetError, Forbidden, NotFound
from trainhouse.core.records import Dataset, DatasetVersion
from trainhouse.jobfs import datasources
from trainhouse.usecases import audit
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

__all__ = [
    "add_source",
    "add_upload",
    "cache_usage",
    "datasets",
    "detail",
    "file_bytes",
    "manifest",
    "remove",
    "users",
    "version",
]


def _owned(rt: Runtime, p: Principal, name: str) -> Dataset | None:
    """The dataset ``name`` (None: there is none yet), if ``p`` may change it: its owner or an
    admin; 403 for anyone else."""
    try:
        found = rt.store.datasets.get(name)
    except NotFound:
        return None
    if not p.is_admin and found.owner != p.name:
        raise Forbidden(f"dataset {name!r} belongs to {found.owner}; {p.name!r} may not change it")
    return found


def _writer(p: Principal) -> None:
    if p.is_job or p.role == "viewer":
        raise Forbidden(f"{p.name!r} ({p.role}) may read datasets, not change them")


def _checksums(manifest: Manifest) -> str:
    kinds = sorted({f.algorithm for f in manifest.files}) or ["sha256"]
    return "+".join(kinds)


def _add(
    rt: Runtime,
    p: Principal,
    name: str,
    manifest: Manifest,
    *,
    source: str | None,
    options: dict[str, str],
    description: str | None,
    how: str,
) -> tuple[DatasetVersion, bool]:
    digest = rt.dataset_files.write_manifest(manifest)
    with rt.store.transaction():
        _owned(rt, p, name)
        made, new = rt.store.datasets.add_version(
            name,
            owner=p.name,
            digest=digest,
            source=source,
            storage_options=options,
            files=len(manifest.files),
            size=manifest.size,
            checksums=_checksums(manifest),
            description=description,
        )
        _owned(rt, p, name)  # checked again: it may have been made meanwhile
        if new:
            audit.record(rt, p, "dataset.add", made.ref, source=source or how, digest=digest)
    return made, new


def add_upload(
    rt: Runtime, p: Principal, name: str, archive: BinaryIO, *, description: str | None = None
) -> tuple[DatasetVersion, bool]:
    """An uploaded directory (a .tar.gz) as a version of ``name`` kept in the server's dataset
    storage; content the name has already gives that version. Returns it and whether it is
    new."""
    _writer(p)
    check_name(name)
    _owned(rt, p, name)
    manifest = rt.dataset_files.store_upload(archive, rt.settings.dataset_upload_bytes)
    return _add(
        rt, p, name, manifest, source=None, options={}, description=description, how="upload"
    )


def add_source(
    rt: Runtime,
    p: Principal,
    name: str,
    url: str,
    *,
    storage_options: dict[str, str] | None = None,
    description: str | None = None,
    copy: bool = False,
) -> tuple[DatasetVersion, bool]:
    """The files under ``url`` as a version of ``name``: listed, and hashed where the store
    gives no checksum; with ``copy``, copied into the server's dataset storage (read from
    there from then on)."""
    _writer(p)
    check_name(name)
    settings = rt.settings
    url = datasources.check_source(
        url, file_roots=settings.dataset_file_roots, allow_private=settings.dataset_allow_private
    )
    options = datasources.check_options(
        url, storage_options or {}, allow_private=settings.dataset_allow_private
    )
    _owned(rt, p, name)
    manifest = datasources.manifest_of(
        url,
        options,
        file_roots=settings.dataset_file_roots,
        allow_private=settings.dataset_allow_private,
    )
    if not manifest.files:
        raise DatasetError(f"{url} holds no files")
    if copy:
        rt.dataset_files.copy_from(url, options, manifest)
        return _add(
            rt, p, name, manifest, source=None, options={}, description=description, how=url
        )
    return _add(
        rt, p, name, manifest, source=url, options=options, description=description, how=url
    )


def datasets(rt: Runtime) -> list[Dataset]:
    return rt.store.datasets.list()


def detail(rt: Runtime, name: str) -> tuple[Dataset, list[DatasetVersion]]:
    return rt.store.datasets.get(name), rt.store.datasets.versions(name)


def version(rt: Runtime, name: str, number: int | None) -> DatasetVersion:
    return rt.store.datasets.version(name, number)


def users_by_version(rt: Runtime, name: str) -> dict[int, list[int]]:
    """The jobs that pinned each version of ``name``, newest first."""
    return rt.store.datasets.users_by_version(name)


def users(rt: Runtime, name: str, number: int | None = None) -> list[int]:
    """The jobs that pinned ``name`` (or that version), newest first."""
    return rt.store.datasets.users(name, number)


def cache_usage(rt: Runtime) -> dict[str, Any]:
    """What the server machine's dataset cache holds: each staged version (the versions its
    manifest is), its bytes, when it was last used and whether a running attempt uses it."""
    from trainhouse.jobfs.datacache import DataCache

    cache = DataCache(rt.settings.dataset_cache, rt.settings.dataset_cache_bytes)
    views = cache.usage()
    refs = rt.store.datasets.refs_of(v.digest for v in views)
    return {
        "node": rt.scheduler.executor.server_node(),
        "bytes": cache.total_bytes(),
        "limit": rt.settings.dataset_cache_bytes,
        "versions": [{**v.to_json(), "refs": refs.get(v.digest, [])} for v in views],
    }


def _readable(rt: Runtime, p: Principal, name: str, number: int) -> DatasetVersion:
    """A version ``p`` may read: anyone signed in; a job's credential, its job's pins only."""
    found = rt.store.datasets.version(name, number)
    if p.is_job:
        pins = rt.store.datasets.pins(p.job_id or 0)
        if not any(pin.name == name and pin.version == number for pin in pins):
            raise Forbidden(f"job {p.job_id} does not pin {name}@{number}")
    return found


def manifest(rt: Runtime, p: Principal, name: str, number: int) -> tuple[DatasetVersion, Manifest]:
    """A version's manifest (every file's path, size and digest)."""
    found = _readable(rt, p, name, number)
    return found, rt.dataset_files.manifest(found.digest)


def file_bytes(
    rt: Runtime, p: Principal, name: str, number: int, path: str
) -> tuple[FileEntry, Iterator[bytes]]:
    """One file of a version the server holds, in chunks (the node verifies its digest)."""
    found, listed = manifest(rt, p, name, number)
    check_path(path)
    entry = next((f for f in listed.files if f.path == path), None)
    if entry is None:
        raise NotFound(f"{found.ref} has no file {path[:200]!r}")
    if found.source is not None:
        raise DatasetError(
            f"{found.ref} is read from {found.source}, not from the server: the nodes read it there"
        )
    return entry, rt.dataset_files.iter_bytes(entry)


def remove(rt: Runtime, p: Principal, name: str, number: int) -> DatasetVersion:
    """Forget version ``number`` of ``name``; refused (409, naming the job) while a queued or
    running job pins it. Files the server held for it alone are deleted."""
    _writer(p)
    with rt.store.transaction():
        if _owned(rt, p, name) is None:
            raise NotFound(f"no dataset named {name!r}")
        gone = rt.store.datasets.remove_version(name, number)
        audit.record(rt, p, "dataset.remove", gone.ref, digest=gone.digest)
    if not rt.store.datasets.has_digest(gone.digest):
        try:
            listed = rt.dataset_files.manifest(gone.digest)
        except (NotFound, DatasetError):
            return gone
        if gone.source is None:
            held = _held_elsewhere(rt)
            rt.dataset_files.remove_unused(listed, lambda entry: entry.key in held)
        rt.dataset_files.remove_manifest(gone.digest)
    return gone


def _held_elsewhere(rt: Runtime) -> set[str]:
    """The content keys of every file a version the server holds lists (read once: their
    bytes are shared, and stay while one lists them)."""
    keys: set[str] = set()
    for found in rt.store.datasets.list():
        for v in rt.store.datasets.versions(found.name):
            if v.source is not None:
                continue
            try:
                keys.update(f.key for f in rt.dataset_files.manifest(v.digest).files)
            except (NotFound, DatasetError):
                continue
    return keys
