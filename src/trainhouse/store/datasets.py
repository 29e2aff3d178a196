"""Datasets (``store.datasets``): names, their numbered versions, and the versions each job pins.

A version's rows say where its files are read from and what they are in sum (count, bytes, the
manifest's digest); the manifest itself (every file) is a file named by that digest in the
server's dataset storage, written before the row. Numbers are per name and never reused;
adding content identical to a version the name has gives that version. A version that a queued
or running job pins cannot be removed; a job's pins outlive the version (lineage).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import IntegrityError

from trainhouse.core.datasets import (
    Pin,
    StagedSource,
    StageRequest,
    check_key,
    check_name,
    parse_ref,
)
from trainhouse.core.errors import NotFound, StoreError
from trainhouse.core.lifecycle import TERMINAL
from trainhouse.core.records import Dataset, DatasetVersion
from trainhouse.store import tables as t

if TYPE_CHECKING:
    from trainhouse.store.database import Database

__all__ = ["DatasetRepo", "insert_pins", "resolve_pins"]

VersionList = list[DatasetVersion]
PinList = list[Pin]  # ``DatasetRepo.list`` shadows the builtin in the class
IdList = list[int]
RefList = list[str]


def _version(row: RowMapping, name: str) -> DatasetVersion:
    return DatasetVersion(
        dataset=name,
        version=int(row["version"]),
        digest=str(row["digest"]),
        source=row["source"],
        storage_options={str(k): str(v) for k, v in dict(row["storage_options"] or {}).items()},
        files=int(row["files"]),
        size=int(row["size"]),
        checksums=str(row["checksums"]),
        description=row["description"],
        created_by=str(row["created_by"]),
        created_at=float(row["created_at"]),
    )


def resolve_pins(conn: Connection, refs: Mapping[str, str]) -> list[Pin]:
    """The versions a spec's ``datasets:`` names, in the transaction that inserts its job: a
    bare name is the newest version now. Each is read under a share lock (PostgreSQL), so a
    removal of it waits for the job to be inserted, then finds it pinned and refuses."""
    pins = []
    for key, ref in sorted(refs.items()):
        check_key(key)
        name, version = parse_ref(ref)
        dataset_id = conn.execute(select(t.datasets.c.id).where(t.datasets.c.name == name)).scalar()
        if dataset_id is None:
            raise NotFound(f"datasets.{key}: no dataset named {name!r} (trainhouse datasets add)")
        query = select(t.dataset_versions.c.version, t.dataset_versions.c.digest).where(
            t.dataset_versions.c.dataset_id == dataset_id
        )
        if version is None:
            query = query.order_by(t.dataset_versions.c.version.desc()).limit(1)
        else:
            query = query.where(t.dataset_versions.c.version == version)
        if conn.dialect.name == "postgresql":
            query = query.with_for_update(read=True)
        row = conn.execute(query).first()
        if row is None:
            raise NotFound(
                f"datasets.{key}: dataset {name!r} has "
                + ("no versions" if version is None else f"no version {version}")
            )
        pins.append(Pin(key, name, int(row.version), str(row.digest)))
    return pins


def insert_pins(conn: Connection, job_id: int, pins: Iterable[Pin]) -> None:
    rows = [
        {"job_id": job_id, "key": p.key, "name": p.name, "version": p.version, "digest": p.digest}
        for p in pins
    ]
    if rows:
        conn.execute(insert(t.job_datasets), rows)


class DatasetRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- reading ---------------------------------------------------------------------------
    def _dataset_id(self, conn: Connection, name: str) -> int:
        found = conn.execute(select(t.datasets.c.id).where(t.datasets.c.name == name)).scalar()
        if found is None:
            raise NotFound(f"no dataset named {name!r}")
        return int(found)

    def list(self) -> list[Dataset]:
        """Every dataset, by name, with its count of versions and its newest one."""
        counts = (
            select(
                t.dataset_versions.c.dataset_id,
                func.count().label("n"),
                func.max(t.dataset_versions.c.version).label("latest"),
            )
            .group_by(t.dataset_versions.c.dataset_id)
            .subquery()
        )
        newest = t.dataset_versions.alias("newest")
        query = (
            select(t.datasets, counts.c.n, counts.c.latest, newest.c.size)
            .outerjoin(counts, counts.c.dataset_id == t.datasets.c.id)
            .outerjoin(
                newest,
                and_(newest.c.dataset_id == t.datasets.c.id, newest.c.version == counts.c.latest),
            )
            .order_by(t.datasets.c.name)
        )
        with self.db.connect() as conn:
            rows = list(conn.execute(query).mappings())
        return [
            Dataset(
                name=r["name"],
                owner=r["owner"],
                created_at=r["created_at"],
                versions=int(r["n"] or 0),
                latest=int(r["latest"]) if r["latest"] is not None else None,
                size=int(r["size"]) if r["size"] is not None else None,
            )
            for r in rows
        ]

    def get(self, name: str) -> Dataset:
        for dataset in self.list():
            if dataset.name == name:
                return dataset
        raise NotFound(f"no dataset named {name!r}")

    def versions(self, name: str) -> VersionList:
        """A dataset's versions, oldest first."""
        with self.db.connect() as conn:
            dataset_id = self._dataset_id(conn, name)
            rows = conn.execute(
                select(t.dataset_versions)
                .where(t.dataset_versions.c.dataset_id == dataset_id)
                .order_by(t.dataset_versions.c.version)
            ).mappings()
            return [_version(r, name) for r in rows]

    def version(self, name: str, version: int | None = None) -> DatasetVersion:
        """``name@version``, or its newest version when ``version`` is None."""
        versions = self.versions(name)
        if not versions:
            raise NotFound(f"dataset {name!r} has no versions")
        if version is None:
            return versions[-1]
        for v in versions:
            if v.version == version:
                return v
        raise NotFound(
            f"dataset {name!r} has no version {version} "
            f"(versions: {', '.join(str(v.version) for v in versions)})"
        )

    def has_digest(self, digest: str) -> bool:
        """Whether any version of any dataset has this manifest (its files are still needed)."""
        with self.db.connect() as conn:
            found = conn.execute(
                select(t.dataset_versions.c.id).where(t.dataset_versions.c.digest == digest)
            ).first()
        return found is not None

    def pins(self, job_id: int) -> PinList:
        """The versions a job reads, by key."""
        return self.pins_of([job_id]).get(job_id, [])

    def pins_of(self, job_ids: Iterable[int]) -> dict[int, PinList]:
        """The versions each of ``job_ids`` reads, by key (a job that pins none: absent)."""
        ids = list(job_ids)
        found: dict[int, PinList] = {}
        if not ids:
            return found
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.job_datasets)
                .where(t.job_datasets.c.job_id.in_(ids))
                .order_by(t.job_datasets.c.job_id, t.job_datasets.c.key)
            ).mappings()
            for r in rows:
                pin = Pin(r["key"], r["name"], int(r["version"]), r["digest"])
                found.setdefault(int(r["job_id"]), []).append(pin)
        return found

    def stage_request(self, job_id: int) -> StageRequest | None:
        """What a job's nodes stage before its ranks start: each pinned version and where its
        files are read (None: it pins nothing). A pinned version removed since (the job ended
        and was resumed) is a NotFound naming it."""
        pins = self.pins(job_id)
        if not pins:
            return None
        sources = []
        with self.db.connect() as conn:
            for pin in pins:
                row = conn.execute(
                    select(t.dataset_versions.c.source, t.dataset_versions.c.storage_options)
                    .join(t.datasets, t.datasets.c.id == t.dataset_versions.c.dataset_id)
                    .where(
                        t.datasets.c.name == pin.name,
                        t.dataset_versions.c.version == pin.version,
                        t.dataset_versions.c.digest == pin.digest,
                    )
                ).first()
                if row is None:
                    raise NotFound(
                        f"datasets.{pin.key}: {pin.ref} was removed after the job pinned it "
                        "(clone the job with --set datasets." + pin.key + "=NAME@VERSION)"
                    )
                options = {str(k): str(v) for k, v in dict(row.storage_options or {}).items()}
                sources.append(StagedSource(pin, row.source, options))
        return StageRequest(tuple(sources))

    def refs_of(self, digests: Iterable[str]) -> dict[str, RefList]:
        """The versions (``NAME@N``) each manifest digest is, by digest."""
        wanted = list(digests)
        found: dict[str, RefList] = {}
        if not wanted:
            return found
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.dataset_versions.c.digest, t.datasets.c.name, t.dataset_versions.c.version)
                .join(t.datasets, t.datasets.c.id == t.dataset_versions.c.dataset_id)
                .where(t.dataset_versions.c.digest.in_(wanted))
                .order_by(t.datasets.c.name, t.dataset_versions.c.version)
            )
            for digest, name, version in rows:
                found.setdefault(str(digest), []).append(f"{name}@{version}")
        return found

    def users_by_version(self, name: str, *, limit: int = 200) -> dict[int, IdList]:
        """The jobs that pinned each version of ``name``, newest first (``limit`` each)."""
        query = (
            select(t.job_datasets.c.version, t.job_datasets.c.job_id)
            .where(t.job_datasets.c.name == name)
            .distinct()
            .order_by(t.job_datasets.c.version, t.job_datasets.c.job_id.desc())
        )
        found: dict[int, IdList] = {}
        with self.db.connect() as conn:
            for version, job_id in conn.execute(query):
                jobs = found.setdefault(int(version), [])
                if len(jobs) < limit:
                    jobs.append(int(job_id))
        return found

    def users(self, name: str, version: int | None = None, *, limit: int = 200) -> IdList:
        """The jobs that pinned ``name`` (or ``name@version``), newest first."""
        query = select(t.job_datasets.c.job_id).where(t.job_datasets.c.name == name)
        if version is not None:
            query = query.where(t.job_datasets.c.version == version)
        query = query.distinct().order_by(t.job_datasets.c.job_id.desc()).limit(limit)
        with self.db.connect() as conn:
            return [int(r) for r in conn.execute(query).scalars()]

    # -- writing ---------------------------------------------------------------------------
    def add_version(
        self,
        name: str,
        *,
        owner: str,
        digest: str,
        source: str | None,
        storage_options: dict[str, str],
        files: int,
        size: int,
        checksums: str,
        description: str | None,
    ) -> tuple[DatasetVersion, bool]:
        """A new version of ``name`` (the dataset is made with its first version, owned by
        ``owner``); content the name already has (the same manifest read from the same place)
        gives the version it got. Returns the version and whether it is new."""
        check_name(name)
        for try_no in range(3):
            try:
                return self._add(
                    name,
                    owner=owner,
                    digest=digest,
                    source=source,
                    storage_options=storage_options,
                    files=files,
                    size=size,
                    checksums=checksums,
                    description=description,
                )
            except IntegrityError:  # a concurrent add took the name or the number
                if try_no == 2:
                    raise
        raise AssertionError("unreachable")

    def _add(self, name: str, **values: Any) -> tuple[DatasetVersion, bool]:
        now = time.time()
        with self.db.transaction() as conn:
            dataset_id = conn.execute(
                select(t.datasets.c.id).where(t.datasets.c.name == name)
            ).scalar()
            if dataset_id is None:
                dataset_id = conn.execute(
                    insert(t.datasets)
                    .values(name=name, owner=values["owner"], created_at=now, last_version=0)
                    .returning(t.datasets.c.id)
                ).scalar_one()
            same = conn.execute(
                select(t.dataset_versions.c.version).where(
                    t.dataset_versions.c.dataset_id == dataset_id,
                    t.dataset_versions.c.digest == values["digest"],
                    # the same bytes elsewhere are another version: each is read from its own
                    t.dataset_versions.c.source.is_(None)
                    if values["source"] is None
                    else t.dataset_versions.c.source == values["source"],
                )
            ).scalar()
            new = same is None
            if same is None:
                number = (
                    conn.execute(
                        select(t.datasets.c.last_version).where(t.datasets.c.id == dataset_id)
                    ).scalar_one()
                    + 1
                )
                conn.execute(
                    update(t.datasets)
                    .where(t.datasets.c.id == dataset_id)
                    .values(last_version=number)
                )
                conn.execute(
                    insert(t.dataset_versions).values(
                        dataset_id=dataset_id,
                        version=number,
                        digest=values["digest"],
                        source=values["source"],
                        storage_options=values["storage_options"],
                        files=values["files"],
                        size=values["size"],
                        checksums=values["checksums"],
                        description=values["description"],
                        created_by=values["owner"],
                        created_at=now,
                    )
                )
                same = number
        return self.version(name, int(same)), new

    def remove_version(self, name: str, version: int) -> DatasetVersion:
        """Forget a version; refused (409, naming the job) while a job that is not ended pins
        it. Returns what was removed (its files are the caller's to remove)."""
        found = self.version(name, version)
        with self.db.transaction() as conn:
            dataset_id = self._dataset_id(conn, name)
            query = select(t.dataset_versions.c.id).where(
                t.dataset_versions.c.dataset_id == dataset_id,
                t.dataset_versions.c.version == version,
            )
            if conn.dialect.name == "postgresql":
                query = query.with_for_update()  # waits for a submit pinning it
            if conn.execute(query).scalar() is None:
                raise NotFound(f"dataset {name!r} has no version {version}")
            user = conn.execute(
                select(t.jobs.c.id, t.jobs.c.state)
                .join(t.job_datasets, t.job_datasets.c.job_id == t.jobs.c.id)
                .where(
                    t.job_datasets.c.name == name,
                    t.job_datasets.c.version == version,
                    t.jobs.c.state.not_in([s.value for s in TERMINAL]),
                )
                .order_by(t.jobs.c.id)
                .limit(1)
            ).first()
            if user is not None:
                raise StoreError(
                    f"{name}@{version} is pinned by job {user.id} ({user.state}): cancel it or "
                    "wait for it to end"
                )
            conn.execute(
                delete(t.dataset_versions).where(
                    t.dataset_versions.c.dataset_id == dataset_id,
                    t.dataset_versions.c.version == version,
                )
            )
        return found
