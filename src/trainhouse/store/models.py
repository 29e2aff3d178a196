"""The model registry (``store.models``): models, their numbered versions, and aliases.

A version points at the files a job saved with ``run.save_model`` (in the job's checkpoint
storage) and keeps their record: sizes, sha256s, signature, metrics, the job, attempt and step,
and the dataset versions the job pinned (``record["datasets"]``: each key's name, version and
manifest digest, kept when the job or the version is deleted).
An alias (``prod``, ``staging``) names one version of its model and moves with
:meth:`ModelRepo.set_alias`; a version an alias names cannot be deleted.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import IntegrityError

from trainhouse.core.errors import ModelError, NotFound, StoreError
from trainhouse.core.modelfiles import check_name
from trainhouse.core.records import Model, ModelVersion
from trainhouse.store import tables as t

if TYPE_CHECKING:
    from trainhouse.store.database import Database

__all__ = ["ModelRepo", "check_alias"]

VersionList = list[ModelVersion]
FileList = list[dict[str, Any]]  # ``ModelRepo.list`` shadows the builtin in the class
SpecList = list[dict[str, Any]]  # a signature's inputs or outputs


def check_alias(alias: str) -> str:
    check_name(alias, "an alias")
    if alias.isdigit() or alias == "latest":
        raise ModelError(f"an alias cannot be a number or 'latest' (they name versions): {alias!r}")
    return alias


def _version(row: RowMapping, name: str, aliases: tuple[str, ...]) -> ModelVersion:
    return ModelVersion(
        model=name,
        version=row["version"],
        job_id=row["job_id"],
        attempt=row["attempt"],
        step=row["step"],
        path=row["path"],
        kind=row["kind"],
        files=list(row["files"] or []),
        size=row["size"],
        metrics=dict(row["metrics"] or {}),
        signature=dict(row["signature"] or {}),
        record=dict(row["record"] or {}),
        created_at=row["created_at"],
        aliases=aliases,
    )


class ModelRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- reading ---------------------------------------------------------------------------
    def _model_id(self, conn: Connection, name: str, *, lock: bool = False) -> int:
        query = select(t.models.c.id).where(t.models.c.name == name)
        if lock:  # PostgreSQL: alias moves of one model are serialized (SQLite: one writer)
            query = query.with_for_update()
        found = conn.execute(query).scalar()
        if found is None:
            raise NotFound(f"no model named {name!r}")
        return int(found)

    def locked_aliases(self, conn: Connection, name: str) -> dict[str, int]:
        """The aliases of ``name`` with the model locked until the caller's transaction ends
        (a promotion reads who holds an alias and moves it, with no move in between)."""
        return self._aliases(conn, self._model_id(conn, name, lock=True))

    def _aliases(self, conn: Connection, model_id: int) -> dict[str, int]:
        rows = conn.execute(
            select(t.model_aliases.c.alias, t.model_aliases.c.version)
            .where(t.model_aliases.c.model_id == model_id)
            .order_by(t.model_aliases.c.alias)
        )
        return {str(a): int(v) for a, v in rows}

    def list(self) -> list[Model]:
        """Every model, by name."""
        counts = (
            select(
                t.model_versions.c.model_id,
                func.count().label("n"),
                func.max(t.model_versions.c.version).label("latest"),
            )
            .group_by(t.model_versions.c.model_id)
            .subquery()
        )
        query = (
            select(t.models, counts.c.n, counts.c.latest)
            .outerjoin(counts, counts.c.model_id == t.models.c.id)
            .order_by(t.models.c.name)
        )
        with self.db.connect() as conn:
            rows = list(conn.execute(query).mappings())
            aliases: dict[int, dict[str, int]] = {}
            for a in conn.execute(select(t.model_aliases).order_by(t.model_aliases.c.alias)):
                aliases.setdefault(int(a.model_id), {})[str(a.alias)] = int(a.version)
        return [
            Model(
                name=r["name"],
                owner=r["owner"],
                created_at=r["created_at"],
                versions=int(r["n"] or 0),
                latest=int(r["latest"]) if r["latest"] is not None else None,
                aliases=aliases.get(int(r["id"]), {}),
            )
            for r in rows
        ]

    def get(self, name: str) -> Model:
        for model in self.list():
            if model.name == name:
                return model
        raise NotFound(f"no model named {name!r}")

    def versions(self, name: str) -> VersionList:
        """A model's versions, oldest first, each with the aliases that name it."""
        with self.db.connect() as conn:
            model_id = self._model_id(conn, name)
            aliases = self._aliases(conn, model_id)
            rows = conn.execute(
                select(t.model_versions)
                .where(t.model_versions.c.model_id == model_id)
                .order_by(t.model_versions.c.version)
            ).mappings()
            return [
                _version(r, name, tuple(a for a, v in aliases.items() if v == r["version"]))
                for r in rows
            ]

    def version(self, name: str, version: int) -> ModelVersion:
        for v in self.versions(name):
            if v.version == version:
                return v
        raise NotFound(f"model {name!r} has no version {version}")

    def resolve(self, name: str, ref: str) -> ModelVersion:
        """The version ``ref`` names: a number, an alias, or ``latest``."""
        ref = str(ref)
        versions = self.versions(name)
        if not versions:
            raise NotFound(f"model {name!r} has no versions")
        if ref == "latest":
            return versions[-1]
        if ref.isdigit():
            return self.version(name, int(ref))
        for v in versions:
            if ref in v.aliases:
                return v
        known = sorted({a for v in versions for a in v.aliases})
        raise NotFound(
            f"model {name!r} has no alias {ref[:64]!r} (aliases: {', '.join(known) or 'none'})"
        )

    def for_job(self, job_id: int) -> VersionList:
        """The versions a job made, oldest first."""
        query = (
            select(t.model_versions, t.models.c.name)
            .join(t.models, t.models.c.id == t.model_versions.c.model_id)
            .where(t.model_versions.c.job_id == job_id)
            .order_by(t.model_versions.c.id)
        )
        with self.db.connect() as conn:
            return [_version(r, r["name"], ()) for r in conn.execute(query).mappings()]

    # -- writing ---------------------------------------------------------------------------
    def add_version(
        self,
        name: str,
        *,
        owner: str,
        job_id: int | None,
        attempt: int,
        step: int,
        path: str,
        kind: str,
        files: FileList,
        metrics: dict[str, float | None] | None = None,
        signature: dict[str, Any] | None = None,
        record: dict[str, Any] | None = None,
    ) -> ModelVersion:
        """A new version of ``name`` (the model is made on its first version). The same files
        of the same job registered again (a retried registration) give the version they got."""
        check_name(name)
        for attempt_no in range(3):
            try:
                return self._add(
                    name,
                    owner=owner,
                    job_id=job_id,
                    attempt=attempt,
                    step=step,
                    path=path,
                    kind=kind,
                    files=files,
                    metrics=metrics or {},
                    signature=signature or {},
                    record=record or {},
                )
            except IntegrityError:  # a concurrent registration took the number
                if attempt_no == 2:
                    raise
        raise AssertionError("unreachable")

    def _add(self, name: str, **values: Any) -> ModelVersion:
        now = time.time()
        with self.db.transaction() as conn:
            model_id = conn.execute(select(t.models.c.id).where(t.models.c.name == name)).scalar()
            if model_id is None:
                model_id = conn.execute(
                    insert(t.models)
                    .values(name=name, owner=values["owner"], created_at=now)
                    .returning(t.models.c.id)
                ).scalar_one()
            same = (
                conn.execute(
                    select(t.model_versions.c.version).where(
                        t.model_versions.c.model_id == model_id,
                        t.model_versions.c.job_id == values["job_id"],
                        t.model_versions.c.path == values["path"],
                    )
                ).scalar()
                if values["job_id"] is not None
                else None
            )
            if same is None:
                # never a number it had before, even one whose version was deleted since
                number = (
                    conn.execute(
                        select(t.models.c.last_version).where(t.models.c.id == model_id)
                    ).scalar_one()
                    + 1
                )
                conn.execute(
                    update(t.models).where(t.models.c.id == model_id).values(last_version=number)
                )
                files = values["files"]
                record = dict(values["record"])
                if values["job_id"] is not None:  # the data it was trained on, by digest
                    pins = conn.execute(
                        select(t.job_datasets)
                        .where(t.job_datasets.c.job_id == values["job_id"])
                        .order_by(t.job_datasets.c.key)
                    ).mappings()
                    trained_on = [
                        {k: p[k] for k in ("key", "name", "version", "digest")} for p in pins
                    ]
                    if trained_on:
                        record["datasets"] = trained_on
                conn.execute(
                    insert(t.model_versions).values(
                        model_id=model_id,
                        version=number,
                        job_id=values["job_id"],
                        attempt=values["attempt"],
                        step=values["step"],
                        path=values["path"],
                        kind=values["kind"],
                        files=files,
                        size=sum(int(f["size"]) for f in files),
                        metrics=values["metrics"],
                        signature=values["signature"],
                        record=record,
                        created_at=now,
                    )
                )
                same = number
        return self.version(name, int(same))

    def learn_outputs(self, name: str, version: int, outputs: SpecList) -> bool:
        """Record ``outputs`` as the signature's outputs of a version that has none yet (a
        checkpoint, whose outputs a replica learns once it serves it); False when it had some
        already (or there is no such version): the first report stays."""
        with self.db.transaction() as conn:
            model_id = self._model_id(conn, name)
            row = conn.execute(
                select(t.model_versions.c.id, t.model_versions.c.signature).where(
                    t.model_versions.c.model_id == model_id, t.model_versions.c.version == version
                )
            ).first()
            if row is None:
                return False
            signature = dict(row.signature or {})
            if signature.get("outputs"):
                return False
            signature["outputs"] = outputs
            conn.execute(
                update(t.model_versions)
                .where(t.model_versions.c.id == row.id)
                .values(signature=signature)
            )
        return True

    def set_alias(self, name: str, alias: str, version: int) -> ModelVersion:
        """Point ``alias`` at ``version`` (made, or moved from where it was)."""
        check_alias(alias)
        now = time.time()
        with self.db.transaction() as conn:
            model_id = self._model_id(conn, name, lock=True)
            exists = conn.execute(
                select(t.model_versions.c.id).where(
                    t.model_versions.c.model_id == model_id, t.model_versions.c.version == version
                )
            ).scalar()
            if exists is None:
                raise NotFound(f"model {name!r} has no version {version}")
            moved = conn.execute(
                update(t.model_aliases)
                .where(t.model_aliases.c.model_id == model_id, t.model_aliases.c.alias == alias)
                .values(version=version, updated_at=now)
            ).rowcount
            if not moved:
                conn.execute(
                    insert(t.model_aliases).values(
                        model_id=model_id, alias=alias, version=version, updated_at=now
                    )
                )
        return self.version(name, version)

    def remove_alias(self, name: str, alias: str) -> None:
        with self.db.transaction() as conn:
            model_id = self._model_id(conn, name)
            gone = conn.execute(
                delete(t.model_aliases).where(
                    t.model_aliases.c.model_id == model_id, t.model_aliases.c.alias == alias
                )
            ).rowcount
        if not gone:
            raise NotFound(f"model {name!r} has no alias {alias[:64]!r}")

    def transfer(self, name: str, owner: str) -> Model:
        """Give the model ``name`` to ``owner``."""
        with self.db.transaction() as conn:
            model_id = self._model_id(conn, name)
            conn.execute(update(t.models).where(t.models.c.id == model_id).values(owner=owner))
        return self.get(name)

    def delete_version(self, name: str, version: int) -> ModelVersion:
        """Forget a version; refused (409) while an alias names it. Returns what was deleted
        (its files are the caller's to remove)."""
        found = self.version(name, version)
        if found.aliases:
            raise StoreError(
                f"{name}@{version} is named by the alias(es) {', '.join(found.aliases)}: "
                "move or remove them first (trainhouse models alias)"
            )
        with self.db.transaction() as conn:
            model_id = self._model_id(conn, name)
            # checked again inside the transaction: an alias set meanwhile wins
            named = conn.execute(
                select(t.model_aliases.c.alias).where(
                    t.model_aliases.c.model_id == model_id, t.model_aliases.c.version == version
                )
            ).scalar()
            if named is not None:
                raise StoreError(f"{name}@{version} is named by the alias {named}: move it first")
            conn.execute(
                delete(t.model_versions).where(
                    t.model_versions.c.model_id == model_id,
                    t.model_versions.c.version == version,
                )
            )
        return found
