"""The model registry: models, versions, aliases, and their files. Everyone signed in reads
(viewers too); members and admins register, move aliases and delete, each write in one
transaction with its audit entry. A job registers what it saved with its own credential
(what ``run.save_model`` calls): checked, not audited."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trainhouse.core.errors import ModelError, StoreError
from trainhouse.core.records import Job, Model, ModelVersion
from trainhouse.usecases import audit
from trainhouse.usecases.access import Principal
from trainhouse.usecases.callers import readable_job
from trainhouse.usecases.runtime import Runtime

__all__ = [
    "delete_version",
    "detail",
    "models",
    "register",
    "register_saved",
    "remove_alias",
    "set_alias",
    "version",
    "version_bytes",
]


def register_saved(rt: Runtime, job: Job, path: str, *, name: str | None = None) -> ModelVersion:
    """A model ``job`` saved in ``path`` (``run.save_model``), checked and registered as a new
    version of ``name`` (default: the name it was saved under)."""
    return rt.saved_models.register(job, path, name=name)


def models(rt: Runtime) -> list[Model]:
    """Every model, by name."""
    return rt.store.models.list()


def detail(rt: Runtime, name: str) -> tuple[Model, list[ModelVersion]]:
    """A model with its versions (job, step, metrics, files, aliases), oldest first."""
    model = rt.store.models.get(name)
    return model, rt.store.models.versions(name)


def version(rt: Runtime, name: str, ref: str) -> ModelVersion:
    """The version ``ref`` names: a number, an alias, or ``latest``."""
    return rt.store.models.resolve(name, ref)


def register(
    rt: Runtime,
    p: Principal,
    name: str,
    job_id: int,
    *,
    step: int | None = None,
    loader: str | None = None,
    inputs: list[dict[str, Any]] | None = None,
) -> ModelVersion:
    """A job's saved model (its newest, or the one of ``step``) as a new version of ``name``;
    with ``loader``, the job's checkpoint (its newest, or the one of ``step``) copied as a
    model that function of the job's code rebuilds. The job must be one ``p`` may read."""
    job = readable_job(rt, p, job_id)
    if loader is None and inputs is not None:
        raise ModelError("inputs are declared with a loader only (a saved model has its own)")
    with rt.store.transaction():
        if loader is None:
            made = rt.saved_models.register_from_job(job, name, step)
        else:
            archive = rt.blobs.path(job.archive_sha256) if job.archive_sha256 else None
            made = rt.saved_models.register_checkpoint(
                job, name, step=step, loader=loader, archive=archive, inputs=inputs
            )
        audit.record(
            rt,
            p,
            "model.register",
            f"{name}@{made.version}",
            job=job.id,
            **({"loader": loader, "step": made.step} if loader else {}),
        )
    return made


def set_alias(rt: Runtime, p: Principal, name: str, alias: str, number: int) -> ModelVersion:
    """Point ``alias`` at version ``number`` (made, or moved from the version it named)."""
    with rt.store.transaction():
        moved = rt.store.models.set_alias(name, alias, number)
        audit.record(rt, p, "model.alias", f"{name}@{alias}", version=number)
    return moved


def remove_alias(rt: Runtime, p: Principal, name: str, alias: str) -> None:
    """Remove ``alias`` from the model ``name``."""
    with rt.store.transaction():
        rt.store.models.remove_alias(name, alias)
        audit.record(rt, p, "model.unalias", f"{name}@{alias}")


def delete_version(rt: Runtime, p: Principal, name: str, number: int) -> ModelVersion:
    """Forget version ``number`` of ``name`` and delete its files; refused (409) while an
    alias names it or a service uses it."""
    with rt.store.transaction():
        users = rt.replicas.users_of(name, number)
        if users:
            raise StoreError(
                f"{name}@{number} is served by {', '.join(users)}: stop the service first "
                "(trainhouse serve stop NAME) or move it to another version"
            )
        gone = rt.saved_models.delete(name, number)
        audit.record(rt, p, "model.delete", f"{name}@{number}")
    return gone


def version_bytes(rt: Runtime, name: str, number: int, file: str) -> Iterator[bytes]:
    """The bytes of one of a version's files, in chunks (the client checks its sha256
    against the record)."""
    found = rt.store.models.version(name, number)
    return rt.saved_models.read(found, file)
