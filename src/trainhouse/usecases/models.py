"""The model registry: models, versions, aliases, and their files. Everyone signed in reads
(viewers too); members and admins register, move aliases and delete, each write in one
transaction with its audit entry. A job registers what it saved with its own credential
(what ``run.save_model`` calls): checked, not audited.

A model belongs to whoever registered its first version (a job's owner, for what a job saved):
a member adds versions to, moves the aliases of and deletes versions of their own models only,
so nobody makes another user's service run their code; an admin does anything, and gives a
model to another user (:func:`transfer`).

A registration reads every file of the model (its sha256 checked against the record) or copies
a checkpoint: :func:`register_saved` and :func:`register` are coroutines that check the caller
and the model's size (``Settings.model_max_bytes``) in a thread, then await that work in the
server's bounded pool (:mod:`trainhouse.usecases.filework`), which writes the version and its
audit entry in one transaction once the files check out."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from trainhouse.core.errors import Forbidden, ModelError, NotFound, StoreError
from trainhouse.core.records import Job, Model, ModelVersion, Promotion
from trainhouse.ingest.savedmodels import Pending
from trainhouse.usecases import audit, filework
from trainhouse.usecases.access import Principal
from trainhouse.usecases.callers import readable_job
from trainhouse.usecases.filework import in_thread
from trainhouse.usecases.runtime import Runtime

__all__ = [
    "check_deletable",
    "delete_version",
    "detail",
    "history",
    "models",
    "register",
    "register_saved",
    "remove_alias",
    "set_alias",
    "transfer",
    "version",
    "version_bytes",
]


def _owned(rt: Runtime, name: str, who: str, *, admin: bool = False) -> Model | None:
    """The model ``name`` (None: there is none yet), if ``who`` may change it: its owner, or
    an admin; 403 for anyone else."""
    try:
        model = rt.store.models.get(name)
    except NotFound:
        return None
    if not admin and model.owner != who:
        raise Forbidden(
            f"model {name!r} belongs to {model.owner}; {who!r} may not change it "
            "(an admin can give it to another user: trainhouse models transfer)"
        )
    return model


async def register_saved(
    rt: Runtime, job: Job, path: str, *, name: str | None = None
) -> ModelVersion:
    """A model ``job`` saved in ``path`` (``run.save_model``), checked and registered as a new
    version of ``name`` (default: the name it was saved under): of a model of the job's owner
    (or a new one, theirs)."""

    def prepare() -> Pending:
        if name is not None:
            _owned(rt, name, job.owner)
        pending = rt.saved_models.prepare(
            job, path, name=name, max_bytes=rt.settings.model_max_bytes
        )
        _owned(rt, pending.name, job.owner)
        return pending

    pending = await in_thread(prepare)

    def work(cancel: threading.Event) -> ModelVersion:
        verified = pending.work(cancel)
        with rt.store.transaction():
            _owned(rt, pending.name, job.owner)
            made = rt.saved_models.add(job, pending.name, verified)
            _owned(rt, made.model, job.owner)  # checked again: it may have been made meanwhile
        return made

    key = ("saved", job.id, pending.path, pending.name)
    what = f"registering {pending.path} of job {job.id} ({pending.size} bytes)"
    return await filework.run(rt, key, what, work)


def models(rt: Runtime) -> list[Model]:
    """Every model, by name."""
    return rt.store.models.list()


def detail(rt: Runtime, name: str) -> tuple[Model, list[ModelVersion]]:
    """A model with its versions (job, step, metrics, files, aliases), oldest first."""
    model = rt.store.models.get(name)
    return model, rt.store.models.versions(name)


def history(rt: Runtime, name: str) -> tuple[list[Promotion], dict[int, list[int]]]:
    """What jobs' ``promote:`` decided about ``name``'s versions (newest first), and the jobs
    that read each version as an input."""
    rt.store.models.get(name)  # 404 for a model there is not
    return rt.store.flows.promotions(name), rt.store.flows.readers(name)


def version(rt: Runtime, name: str, ref: str) -> ModelVersion:
    """The version ``ref`` names: a number, an alias, or ``latest``."""
    return rt.store.models.resolve(name, ref)


async def register(
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

    def prepare() -> tuple[Job, Pending]:
        job = readable_job(rt, p, job_id)
        if loader is None and inputs is not None:
            raise ModelError("inputs are declared with a loader only (a saved model has its own)")
        _owned(rt, name, p.name, admin=p.is_admin)
        cap = rt.settings.model_max_bytes
        if loader is None:
            return job, rt.saved_models.prepare_from_job(job, name, step, max_bytes=cap)
        archive = rt.blobs.path(job.archive_sha256) if job.archive_sha256 else None
        pending = rt.saved_models.prepare_checkpoint(
            job,
            name,
            step=step,
            loader=loader,
            archive=archive,
            inputs=inputs,
            max_bytes=cap,
        )
        return job, pending

    job, pending = await in_thread(prepare)
    # a new model is the registering user's (auth off: its job's owner's)
    owner = p.name if p.authenticated else job.owner

    def work(cancel: threading.Event) -> ModelVersion:
        verified = pending.work(cancel)
        with rt.store.transaction():
            existed = _owned(rt, name, p.name, admin=p.is_admin)
            made = rt.saved_models.add(job, name, verified)
            if existed is None:  # made by this registration, or by another one meanwhile
                made_by = rt.store.models.get(name)
                if made_by.owner == job.owner and owner != job.owner:
                    rt.store.models.transfer(name, owner)
                elif made_by.owner not in (job.owner, owner):
                    _owned(rt, name, p.name, admin=p.is_admin)
            audit.record(
                rt,
                p,
                "model.register",
                f"{name}@{made.version}",
                job=job.id,
                **({"loader": loader, "step": made.step} if loader else {}),
            )
        return made

    key = ("register", p.name, name, job.id, pending.path, loader, repr(inputs))
    what = f"registering {name} from job {job.id} ({pending.size} bytes)"
    return await filework.run(rt, key, what, work)


def set_alias(rt: Runtime, p: Principal, name: str, alias: str, number: int) -> ModelVersion:
    """Point ``alias`` at version ``number`` (made, or moved from the version it named)."""
    with rt.store.transaction():
        _must_own(rt, p, name)
        moved = rt.store.models.set_alias(name, alias, number)
        audit.record(rt, p, "model.alias", f"{name}@{alias}", version=number)
    return moved


def remove_alias(rt: Runtime, p: Principal, name: str, alias: str) -> None:
    """Remove ``alias`` from the model ``name``."""
    with rt.store.transaction():
        _must_own(rt, p, name)
        rt.store.models.remove_alias(name, alias)
        audit.record(rt, p, "model.unalias", f"{name}@{alias}")


def check_deletable(rt: Runtime, p: Principal, name: str, number: int) -> None:
    """Refuse deleting version ``number`` of ``name`` unless ``p`` may change the model, no
    alias names the version and no service uses it (403, 409)."""
    _must_own(rt, p, name)
    found = rt.store.models.version(name, number)  # with the aliases that name it
    users = rt.replicas.users_of(name, number)
    if users:
        raise StoreError(
            f"{name}@{number} is served by {', '.join(users)}: stop the service first "
            "(trainhouse serve stop NAME) or move it to another version"
        )
    if found.aliases:
        raise StoreError(
            f"{name}@{number} is named by the alias(es) {', '.join(found.aliases)}: "
            "move or remove them first (trainhouse models alias)"
        )


def delete_version(rt: Runtime, p: Principal, name: str, number: int) -> ModelVersion:
    """Forget version ``number`` of ``name`` and delete its files; refused (409) while an
    alias names it or a service uses it."""
    with rt.store.transaction():
        check_deletable(rt, p, name, number)
        gone = rt.saved_models.delete(name, number)
        audit.record(rt, p, "model.delete", f"{name}@{number}")
    return gone


def transfer(rt: Runtime, p: Principal, name: str, owner: str) -> Model:
    """Give the model ``name`` to the user ``owner`` (admins only; with auth on, a user that
    exists)."""
    if not p.is_admin:
        raise Forbidden(f"only admins may give a model to another user; {p.name!r} is a {p.role}")
    with rt.store.transaction():
        model = rt.store.models.get(name)
        if p.authenticated:
            rt.store.accounts.get_user(owner)  # 404 for a user there is not
        moved = rt.store.models.transfer(name, owner)
        audit.record(rt, p, "model.transfer", name, owner=owner, previous=model.owner)
    return moved


def _must_own(rt: Runtime, p: Principal, name: str) -> None:
    if _owned(rt, name, p.name, admin=p.is_admin) is None:
        raise NotFound(f"no model named {name!r}")


def version_bytes(rt: Runtime, name: str, number: int, file: str) -> Iterator[bytes]:
    """The bytes of one of a version's files, in chunks (the client checks its sha256
    against the record)."""
    found = rt.store.models.version(name, number)
    return rt.saved_models.read(found, file)
