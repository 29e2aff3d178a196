"""The server's side of the model registry: registering what a job saved, reading and deleting
a version's files.

A version's files lie in the job's checkpoint storage (``models/<name>/step-<n>/``, see
:mod:`trainhouse.core.modelfiles`), opened through
:class:`~trainhouse.ingest.checkpoints.Checkpoints` as checkpoints are: from a trusted anchor, no
link followed, regular files only. What the job wrote there is hostile: the record is read up to
``MAX_MODEL_RECORD`` bytes and validated field by field, only the files a kind has are accepted, and
each file's size and sha256 are checked against the record before the version is registered (the
record's own sha256 is added then).

A registration comes in three parts, so that no request's thread reads a job's files: a
``prepare_*`` method checks what it can without reading them (the record, each file's size, the
model's bytes together against the server's cap, a sparse file counted at its apparent size) and
returns a :class:`Pending` whose ``work`` (hashing, or copying a checkpoint) runs in the
server's bounded pool of background work (:class:`~trainhouse.core.background.WorkPool`); its
:class:`Verified` result becomes a version with :meth:`SavedModels.add`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainhouse.core.errors import ArchiveError, CheckpointError, ModelError, NotFound, StoreError
from trainhouse.core.modelfiles import (
    CHECKPOINT,
    LOADER_KINDS,
    MAX_MODEL_RECORD,
    PROGRAM,
    RECORD,
    ROOT,
    WEIGHTS,
    check_inputs,
    check_loader,
    check_name,
    step_of,
    version_dir,
)
from trainhouse.core.modelrecord import SavedModelRecord
from trainhouse.ingest.checkpoints import CHUNK, Checkpoints, hash_file
from trainhouse.jobfs.storage import confine, is_temp
from trainhouse.jobfs.workdir import list_members
from trainhouse.store import Checkpoint, Job, ModelVersion, Store

log = logging.getLogger(__name__)

#: the files each kind of saved model has, besides its record
KIND_FILES = {"export": {PROGRAM, WEIGHTS}, "loader": {WEIGHTS}, "checkpoint": {CHECKPOINT}}


@dataclass(frozen=True)
class Verified:
    """A saved model's record and files, checked: what a new version is made of."""

    path: str
    record: SavedModelRecord
    raw: bytes  # the record's bytes
    files: list[dict[str, Any]]  # each file's name, size and sha256 (the record's own not yet)


@dataclass(frozen=True)
class Pending:
    """A registration checked as far as it can be without reading the model's files: its
    directory, the name its version takes, the bytes :attr:`work` reads (or copies), and that
    work, a function of a stop event (set when the server stops), for a background thread."""

    path: str
    name: str
    size: int
    work: Callable[[threading.Event], Verified]


def _check_cap(what: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise ModelError(
            f"{what} holds {size} bytes, more than the {max_bytes} a model version may hold "
            "(the server's --model-max-bytes); refused before reading it"
        )


class SavedModels:
    """Registering saved models and reading their files."""

    def __init__(self, store: Store, checkpoints: Checkpoints) -> None:
        self.store = store
        self.checkpoints = checkpoints

    # -- registering -----------------------------------------------------------------------
    def prepare(self, job: Job, path: str, *, name: str | None = None, max_bytes: int) -> Pending:
        """The model ``job`` saved in ``path``, to register as a new version of ``name``
        (default: the name it was saved under): its record read and checked, each file's
        size checked against it and their total against ``max_bytes``; the files' sha256 are
        the pending work's."""
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
        if (record.kind in LOADER_KINDS) != (record.loader is not None):
            raise ModelError(
                f"{path}/{RECORD}: a {' or '.join(map(repr, LOADER_KINDS))} model names its "
                "loader, no other does"
            )
        if (record.kind == "checkpoint") != (record.checkpoint is not None):
            raise ModelError(
                f"{path}/{RECORD}: a 'checkpoint' model names the checkpoint it came from, no "
                "other does"
            )
        names = [f.name for f in record.files]
        if set(names) != KIND_FILES[record.kind] or len(names) != len(set(names)):
            raise ModelError(
                f"{path}/{RECORD} lists the files {names}; a {record.kind!r} model has "
                f"{sorted(KIND_FILES[record.kind])}"
            )
        for entry in record.files:  # sizes only (a sparse file's apparent one): nothing read
            rel = f"{path}/{entry.name}"
            try:
                size = storage.size(rel)
            except FileNotFoundError:
                raise ModelError(f"{rel} is listed in the record but missing") from None
            except (OSError, CheckpointError) as exc:
                raise ModelError(f"{rel} cannot be read: {exc}") from None
            if size != entry.size:
                raise ModelError(f"{rel} is {size} bytes; its record says {entry.size}")
        total = sum(entry.size for entry in record.files)
        _check_cap(f"the model in {path}", total, max_bytes)

        def work(cancel: threading.Event) -> Verified:
            return self._verify(job, path, record, raw, cancel)

        return Pending(path, check_name(name or record.name), total, work)

    def _verify(
        self,
        job: Job,
        path: str,
        record: SavedModelRecord,
        raw: bytes,
        cancel: threading.Event,
    ) -> Verified:
        """Each of the record's files hashed (never more than its size) and checked."""
        storage = self.checkpoints.storage(job.id)
        files = []
        for entry in record.files:
            rel = f"{path}/{entry.name}"
            try:
                actual = hash_file(storage, rel, entry.size, cancel=cancel)
            except FileNotFoundError:
                raise ModelError(f"{rel} is listed in the record but missing") from None
            except (OSError, CheckpointError) as exc:
                raise ModelError(f"{rel} cannot be read: {exc}") from None
            if actual != entry.sha256:
                raise ModelError(
                    f"{rel}: sha256 {actual[:16]}... does not match its record's "
                    f"{entry.sha256[:16]}..."
                )
            files.append(entry.model_dump())
        return Verified(path, record, raw, files)

    def add(self, job: Job, name: str, verified: Verified) -> ModelVersion:
        """A new version of ``name``: what :meth:`prepare` and its work checked."""
        v = verified
        return self._add(job, check_name(name), v.path, v.record, v.raw, v.files)

    def _add(
        self,
        job: Job,
        name: str,
        path: str,
        record: SavedModelRecord,
        raw: bytes,
        files: list[dict[str, Any]],
    ) -> ModelVersion:
        """A new version of ``name``: the checked ``files`` plus the record's own."""
        own = {"name": RECORD, "size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        files = [*files, own]
        kept: dict[str, Any] = {
            "saved_as": record.name,
            "loader": record.loader,
            "torch": record.torch,
            "code_digest": record.code_digest,
            "workdir_sha256": job.archive_sha256,
        }
        if record.checkpoint is not None:
            kept["checkpoint"] = record.checkpoint.model_dump()
        return self.store.models.add_version(
            name,
            owner=job.owner,
            job_id=job.id,
            attempt=record.attempt,
            step=record.step,
            path=path,
            kind=record.kind,
            files=files,
            metrics=record.metrics,
            signature=record.signature.model_dump(),
            record=kept,
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

    def prepare_from_job(self, job: Job, name: str, step: int | None, *, max_bytes: int) -> Pending:
        """``models register NAME --job J [--step S]``: the job's model saved at ``step`` (its
        newest by default), preferably the one saved as ``name`` (:meth:`prepare`)."""
        # the copies of its checkpoints registered with a loader are not what it saved
        copies = {v.path for v in self.store.models.for_job(job.id) if v.kind == "checkpoint"}
        saved = [
            s for s in self.saved(job) if (step is None or s[1] == step) and s[2] not in copies
        ]
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
        return self.prepare(job, pool[-1][2], name=name, max_bytes=max_bytes)

    # -- registering a checkpoint -----------------------------------------------------------
    def prepare_checkpoint(
        self,
        job: Job,
        name: str,
        *,
        step: int | None,
        loader: str,
        archive: Path | None,
        inputs: list[dict[str, Any]] | None = None,
        max_bytes: int,
    ) -> Pending:
        """``models register NAME --job J [--step S] --loader FILE.py:FUNCTION``: the job's
        checkpoint of ``step`` (its newest by default), to copy into the job's model layout
        (verified against its registered digest as it is copied, so retention never deletes
        it), with a record of kind "checkpoint" that names the loader, registered as a new
        version of ``name``. The loader's file must be in the job's workdir ``archive``
        (listed, never extracted); ``inputs``, when given, are the model's signature. A
        checkpoint over ``max_bytes`` (its registered size) is refused here; the copy is the
        pending work's."""
        check_name(name)
        file = check_loader(loader).partition(":")[0]
        self._check_loader_file(job, archive, file, loader)
        signature = {"inputs": check_inputs(inputs) if inputs else [], "outputs": []}
        ckpt = self._checkpoint(job, step)
        path = version_dir(name, ckpt.step)
        storage = self.checkpoints.storage(job.id)
        source = {
            "id": ckpt.id,
            "path": ckpt.path,
            "algorithm": ckpt.algorithm,
            "digest": ckpt.sha256,
        }
        try:
            exists = storage.exists(path)
        except (OSError, CheckpointError) as exc:
            raise ModelError(f"{path} cannot be read: {exc}") from None
        if exists:
            return self._again(job, name, path, loader, source, signature, max_bytes)
        _check_cap(f"job {job.id}'s checkpoint of step {ckpt.step}", ckpt.size, max_bytes)
        with contextlib.suppress(OSError):
            free = storage.free_bytes()
            if free is not None and ckpt.size > free:
                raise ModelError(
                    f"job {job.id}'s checkpoint of step {ckpt.step} is {ckpt.size} bytes; its "
                    f"storage has {free} bytes free for the copy"
                )

        def work(cancel: threading.Event) -> Verified:
            return self._copy_checkpoint(job, ckpt, name, path, loader, signature, source, cancel)

        return Pending(path, name, ckpt.size, work)

    def _copy_checkpoint(
        self,
        job: Job,
        ckpt: Checkpoint,
        name: str,
        path: str,
        loader: str,
        signature: dict[str, Any],
        source: dict[str, Any],
        cancel: threading.Event,
    ) -> Verified:
        """The checkpoint copied (digest checked), its record written, published whole."""
        storage = self.checkpoints.storage(job.id)
        tmp = storage.temp_name(path)
        try:
            sha256 = self.checkpoints.copy_file(job, ckpt, f"{tmp}/{CHECKPOINT}", cancel)
            record = SavedModelRecord.model_validate(
                {
                    "name": name,
                    "kind": "checkpoint",
                    "loader": loader,
                    "signature": signature,
                    "torch": None,
                    "job_id": job.id,
                    "attempt": ckpt.attempt,
                    "step": ckpt.step,
                    "code_digest": None,
                    "metrics": ckpt.metrics,
                    "files": [{"name": CHECKPOINT, "size": ckpt.size, "sha256": sha256}],
                    "created_at": time.time(),
                    "checkpoint": source,
                }
            )
            raw = record.model_dump_json(indent=1).encode()
            with storage.open_write(f"{tmp}/{RECORD}") as fh:
                fh.write(raw)
            storage.publish(tmp, path)
        except BaseException:
            with contextlib.suppress(Exception):
                storage.delete(tmp)
            raise
        return Verified(path, record, raw, [f.model_dump() for f in record.files])

    def _check_loader_file(self, job: Job, archive: Path | None, file: str, loader: str) -> None:
        """The loader's file is in the job's uploaded workdir (its archive listed, never
        extracted): a 4xx naming what is missing."""
        if job.archive_sha256 is None:
            raise ModelError(
                f"job {job.id} has no uploaded workdir (a run tracked from outside): the "
                f"loader {loader} cannot be part of its code"
            )
        if archive is None or not archive.is_file():
            raise NotFound(f"job {job.id}'s workdir archive is no longer on the server")
        try:
            names = list_members(archive)
        except ArchiveError as exc:
            raise ModelError(f"job {job.id}'s workdir archive cannot be listed: {exc}") from None
        if file not in names:
            py = sorted(n for n in names if n.endswith(".py"))
            shown = ", ".join(py[:10]) or "no Python files"
            raise ModelError(
                f"the loader {loader}: {file} is not in job {job.id}'s workdir (its Python "
                f"files: {shown})"
            )

    def _checkpoint(self, job: Job, step: int | None) -> Checkpoint:
        """The job's checkpoint of ``step``, or its newest (registered, not corrupt)."""
        live = [c for c in self.store.checkpoints.list(job.id) if c.corrupt is None]
        found = [c for c in live if step is None or c.step == step]
        if not found:
            steps = ", ".join(str(c.step) for c in live[-10:]) or "none"
            at = f" of step {step}" if step is not None else ""
            raise NotFound(f"job {job.id} has no checkpoint{at} (its checkpoints' steps: {steps})")
        ckpt = max(found, key=lambda c: (c.step, c.id))
        if ckpt.kind != "file":
            raise ModelError(
                f"job {job.id}'s checkpoint of step {ckpt.step} is {ckpt.kind} (one directory "
                "per rank's shards): only a checkpoint of one file can be registered with a "
                "loader"
            )
        return ckpt

    def _again(
        self,
        job: Job,
        name: str,
        path: str,
        loader: str,
        source: dict[str, Any],
        signature: dict[str, Any],
        max_bytes: int,
    ) -> Pending:
        """The same checkpoint registered again with the same loader: its copy, checked
        again; anything else already in ``path`` is a conflict."""
        storage = self.checkpoints.storage(job.id)
        try:
            raw = storage.read_bytes(f"{path}/{RECORD}", max_size=MAX_MODEL_RECORD)
            found = json.loads(raw)
        except (OSError, CheckpointError, ValueError):
            found = None
        same = (
            isinstance(found, dict)
            and found.get("kind") == "checkpoint"
            and found.get("loader") == loader
            and found.get("checkpoint") == source
            and found.get("signature") == signature
        )
        if not same and isinstance(found, dict) and found.get("kind") == "checkpoint":
            declared = len((found.get("signature") or {}).get("inputs") or [])
            raise StoreError(
                f"job {job.id} already holds {path}, a copy of its checkpoint of step "
                f"{found.get('step')} with the loader {found.get('loader')} and {declared} "
                "declared inputs: register it with the same loader and inputs, or under "
                f"another name than {name!r}"
            )
        if not same:
            raise StoreError(
                f"job {job.id} already holds a model in {path} (run.save_model saved it): "
                f"register it without --loader, or under another name than {name!r}"
            )
        return self.prepare(job, path, name=name, max_bytes=max_bytes)

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
