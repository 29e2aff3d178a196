"""The server's side of the model registry: registering what a job saved, reading and deleting
a version's files.

A version's files lie in the job's checkpoint storage (``models/<name>/step-<n>/``, see
:mod:`trainhouse.modelfiles`), opened through :class:`~trainhouse.server.checkpoints.Checkpoints`
as checkpoints are: from a trusted anchor, no link followed, regular files only. What the job
wrote there is hostile: the record is read up to ``MAX_MODEL_RECORD`` bytes and validated field
by field, only the files a kind has are accepted, and each file's size and sha256 are checked
against the record before the version is registered (the record's own sha256 is added then).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator

from pydantic import ValidationError

from trainhouse.errors import CheckpointError, ModelError, NotFound
from trainhouse.modelfiles import (
    MAX_MODEL_RECORD,
    PROGRAM,
    RECORD,
    ROOT,
    WEIGHTS,
    check_loader,
    check_name,
    step_of,
)
from trainhouse.server.checkpoints import CHUNK, Checkpoints
from trainhouse.server.schemas import SavedModelRecord
from trainhouse.storage import confine, is_temp
from trainhouse.store import Job, ModelVersion, Store

log = logging.getLogger(__name__)

#: the files each kind of saved model has, besides its record
KIND_FILES = {"export": {PROGRAM, WEIGHTS}, "loader": {WEIGHTS}}


class ModelFiles:
    """Registering saved models and reading their files."""

    def __init__(self, store: Store, checkpoints: Checkpoints) -> None:
        self.store = store
        self.checkpoints = checkpoints

    # -- registering -----------------------------------------------------------------------
    def register(self, job: Job, path: str, *, name: str | None = None) -> ModelVersion:
        """Register the model ``job`` saved in ``path`` as a new version of ``name`` (default:
        the name it was saved under), once its record and files check out."""
        path = confine(path)
        if step_of(path) is None or not path.startswith(f"{ROOT}/") or path.count("/") != 2:
            raise ModelError(
                f"{path!r} is not a saved model's directory ({ROOT}/<name>/step-<step>)"
            )
        storage = self.checkpoints.storage(job.id)
        try:
            raw = storage.read_bytes(f"{path}/{RECORD}", max_size=MAX_MODEL_RECORD)
        except FileNotFoundError:
            raise NotFound(f"job {job.id} saved no model in {path}") from None
        except (OSError, CheckpointError) as exc:
            raise ModelError(f"{path}/{RECORD} cannot be read: {exc}") from None
        try:
            record = SavedModelRecord.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the record"
            raise ModelError(
                f"{path}/{RECORD} is not a valid record: {where}: {first['msg']}"
            ) from None
        if record.loader is not None:
            check_loader(record.loader)
        if (record.kind == "loader") != (record.loader is not None):
            raise ModelError(f"{path}/{RECORD}: a 'loader' model names its loader, no other does")
        names = [f.name for f in record.files]
        if set(names) != KIND_FILES[record.kind] or len(names) != len(set(names)):
            raise ModelError(
                f"{path}/{RECORD} lists the files {names}; a {record.kind!r} model has "
                f"{sorted(KIND_FILES[record.kind])}"
            )
        files = []
        for entry in record.files:
            rel = f"{path}/{entry.name}"
            try:
                size = storage.size(rel)
                actual = storage.digest(rel, max_bytes=entry.size) if size == entry.size else ""
            except FileNotFoundError:
                raise ModelError(f"{rel} is listed in the record but missing") from None
            except (OSError, CheckpointError) as exc:
                raise ModelError(f"{rel} cannot be read: {exc}") from None
            if size != entry.size:
                raise ModelError(f"{rel} is {size} bytes; its record says {entry.size}")
            if actual != entry.sha256:
                raise ModelError(
                    f"{rel}: sha256 {actual[:16]}... does not match its record's "
                    f"{entry.sha256[:16]}..."
                )
            files.append(entry.model_dump())
        files.append({"name": RECORD, "size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()})
        return self.store.models.add_version(
            check_name(name or record.name),
            owner=job.owner,
            job_id=job.id,
            attempt=record.attempt,
            step=record.step,
            path=path,
            kind=record.kind,
            files=files,
            metrics=record.metrics,
            signature=record.signature.model_dump(),
            record={
                "saved_as": record.name,
                "loader": record.loader,
                "torch": record.torch,
                "code_digest": record.code_digest,
                "workdir_sha256": job.archive_sha256,
            },
        )

    def saved(self, job: Job) -> list[tuple[str, int, str]]:
        """What ``job`` saved with ``run.save_model``: (name, step, path), by step."""
        storage = self.checkpoints.storage(job.id)
        found = []
        try:
            for name in storage.list(ROOT):
                if is_temp(name) or not storage.is_dir(f"{ROOT}/{name}"):
                    continue
                for sub in storage.list(f"{ROOT}/{name}"):
                    step = step_of(sub)
                    if step is not None:
                        found.append((name, step, f"{ROOT}/{name}/{sub}"))
        except (OSError, CheckpointError) as exc:
            raise ModelError(f"job {job.id}'s saved models cannot be listed: {exc}") from None
        return sorted(found, key=lambda f: (f[1], f[0]))

    def register_from_job(self, job: Job, name: str, step: int | None) -> ModelVersion:
        """``models register NAME --job J [--step S]``: the job's model saved at ``step`` (its
        newest by default), preferably the one saved as ``name``."""
        saved = [s for s in self.saved(job) if step is None or s[1] == step]
        if not saved:
            at = f" at step {step}" if step is not None else ""
            raise NotFound(f"job {job.id} saved no model{at} (run.save_model)")
        named = [s for s in saved if s[0] == name]
        pool = named or saved
        if not named and len({s[0] for s in saved}) > 1:
            raise ModelError(
                f"job {job.id} saved several models ({', '.join(sorted({s[0] for s in saved}))}) "
                f"and none as {name!r}: name one of them"
            )
        return self.register(job, pool[-1][2], name=name)

    # -- reading and deleting --------------------------------------------------------------
    def read(self, version: ModelVersion, file: str) -> Iterator[bytes]:
        """The bytes of one of a version's files, in chunks."""
        if file not in {f["name"] for f in version.files}:
            raise NotFound(f"{version.model}@{version.version} has no file {file[:64]!r}")
        if version.job_id is None:
            raise NotFound(f"{version.model}@{version.version}'s job is deleted, with its files")
        storage = self.checkpoints.storage(version.job_id)
        try:
            fh = storage.open_read(f"{version.path}/{file}")
        except FileNotFoundError:
            raise NotFound(f"{version.model}@{version.version}'s {file} is gone") from None
        except OSError as exc:
            raise ModelError(f"{version.model}@{version.version}'s {file}: {exc}") from None

        def chunks() -> Iterator[bytes]:
            with fh:
                while data := fh.read(CHUNK):
                    yield data

        return chunks()

    def delete(self, name: str, version: int) -> ModelVersion:
        """Forget a version (refused while an alias names it) and delete its files."""
        gone = self.store.models.delete_version(name, version)
        still = [v for v in self.store.models.for_job(gone.job_id or -1) if v.path == gone.path]
        if gone.job_id is not None and not still:  # another name may hold the same files
            try:
                self.checkpoints.storage(gone.job_id).delete(gone.path)
            except OSError as exc:
                log.warning("%s@%s: files not deleted: %s", name, version, exc)
        return gone
