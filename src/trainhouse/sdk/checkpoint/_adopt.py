"""Checkpoints another framework wrote, made the job's own (the integrations' side of
:mod:`trainhouse.sdk.checkpoint`).

The Hugging Face Trainer writes ``checkpoint-N/`` directories and Lightning ``.ckpt`` files where
the user's script says. :func:`adopt` copies one into the job's checkpoint storage under a temp
name, hashes it (sha256: a file's, or a directory's :func:`~trainhouse.jobfs.storage.tree_digest`),
publishes it as ``step-XXXXXXXXX/`` (a directory, registered as ``sharded``) or
``step-XXXXXXXXX.pt`` (a file), and commits it like the checkpointer's own saves: the metrics
logged before it flushed first, then its sidecar record, then its registration with the server.
Only regular files are copied (a link or a FIFO in the source is refused), and nothing appears
under the final name before every byte of the copy is written and fsynced.

:func:`resume_choice` and :func:`fetch` are the other half: the main rank picks the job's newest
verified checkpoint (and tells the server that the run goes on from its step), and each node
gets it as a local path the framework can load (a copy of its own where the storage is remote:
another node's scratch directory is not on this node's disk).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainhouse.core.errors import CheckpointError
from trainhouse.jobfs.storage import CHUNK, LocalStorage, confine, tree_digest
from trainhouse.sdk.checkpoint._checkpointer import Checkpointer
from trainhouse.sdk.checkpoint._finding import dir_name, file_name
from trainhouse.sdk.checkpoint._support import HashingWriter

log = logging.getLogger("trainhouse")


def _source_files(source: Path) -> list[tuple[str, Path, int]]:
    """(relpath, path, size) of every file under the directory ``source``, sorted; links and
    anything but regular files and directories are refused."""
    out: list[tuple[str, Path, int]] = []
    for dirpath, dirnames, filenames in os.walk(source, followlinks=False):
        base = Path(dirpath)
        for name in dirnames:
            if (base / name).is_symlink():
                raise CheckpointError(f"{base / name} is a link: checkpoints are copied unlinked")
        for name in filenames:
            path = base / name
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(f"{path} is not a regular file")
            out.append((path.relative_to(source).as_posix(), path, st.st_size))
    return sorted(out)


def _copy_file(checkpointer: Checkpointer, src: Path, rel: str) -> tuple[str, int]:
    """Copy the regular file ``src`` to ``rel`` in the storage; its sha256 and size, hashed from
    the bytes written (the source is read once)."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise CheckpointError(f"{src} is not a regular file")
        with (
            checkpointer.storage.open_write(rel) as out,
            HashingWriter(out, "sha256") as writer,
        ):
            while chunk := fh.read(CHUNK):
                writer.write(chunk)
    return writer.hexdigest(), writer.size


def adopt(
    checkpointer: Checkpointer,
    source: str | os.PathLike[str],
    *,
    step: int,
    metrics: dict[str, float | None] | None = None,
    commit: bool = True,
) -> dict[str, Any]:
    """Make the checkpoint file or directory ``source`` the job's checkpoint of ``step``
    (see the module's docstring); its record as registered. Not collective: the main rank
    calls it once the framework has written every file of ``source`` (the others may wait in
    a barrier). A failed copy leaves nothing behind and raises CheckpointError.

    ``commit=False`` publishes the copy but leaves it invisible to a resume (no record, not
    registered) until :func:`commit` is called with the record returned: for a framework that
    logs the metrics of the step a checkpoint holds only after writing it (Lightning)."""
    src = Path(source)
    if step < 0:
        raise CheckpointError(f"checkpoint step must be >= 0, got {step}")
    st = src.lstat() if src.exists() or src.is_symlink() else None
    if st is None:
        raise CheckpointError(f"cannot register checkpoint {src}: it does not exist")
    directory = stat.S_ISDIR(st.st_mode)
    if not directory and not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"cannot register checkpoint {src}: not a regular file or directory")
    name = dir_name(step) if directory else file_name(step)
    storage = checkpointer.storage
    tmp = storage.temp_name(name)
    needed = 0
    try:
        if directory:
            files = _source_files(src)
            needed = sum(size for _, _, size in files)
            storage.makedirs(tmp)
            entries = []
            for rel, path, _ in files:
                digest, size = _copy_file(checkpointer, path, f"{tmp}/{confine(rel)}")
                entries.append((rel, digest, size))
            size, digest = sum(e[2] for e in entries), tree_digest(entries)
        else:
            needed = st.st_size
            digest, size = _copy_file(checkpointer, src, tmp)
        storage.publish(tmp, name)
    except BaseException as exc:
        mapped = checkpointer._failed(exc, tmp, name, needed)
        if isinstance(mapped, CheckpointError):
            raise mapped from exc
        raise CheckpointError(f"cannot register checkpoint {src}: {exc}") from exc
    clean = dict(metrics or {})
    record = checkpointer._record(
        int(step), name, size, digest, clean, "sharded" if directory else "file"
    )
    log.info("trainhouse: checkpoint %s (step %s) copied to %s", src, step, storage.url)
    return commit_record(checkpointer, record) if commit else record


def commit_record(checkpointer: Checkpointer, record: dict[str, Any]) -> dict[str, Any]:
    """Make a checkpoint published by ``adopt(..., commit=False)`` visible to a resume: the
    metrics logged so far flushed (or spooled), then its record written and registered."""
    return checkpointer._commit(record)


def resume_choice(checkpointer: Checkpointer) -> dict[str, Any] | None:
    """The record of the job's newest checkpoint whose sha256 matches, or None on a fresh
    start; the server is told that the run goes on from its step (steps that earlier attempts
    logged after it are dropped). Main rank only: the other ranks get the record from it."""
    chosen = checkpointer.latest()
    checkpointer._registry.resume_from(chosen)
    return chosen


def fetch(
    checkpointer: Checkpointer, record: Mapping[str, Any], scratch: str | os.PathLike[str]
) -> Path:
    """The checkpoint ``record`` names as a path on this machine: where it lies for a local
    (or shared) storage, else a copy downloaded under ``scratch`` and checked against the
    record's digest (a CheckpointError if it differs). Any rank: on a job of several nodes with
    remote storage, each node needs a copy of its own."""
    path = str(record["path"])
    local = checkpointer.storage.local_path(path)
    if local is not None:
        return local
    local = checkpointer.storage.download(path, Path(scratch) / confine(path))
    expected = record.get("sha256")
    if expected is not None:
        algorithm = str(record.get("algorithm") or "sha256")
        actual = LocalStorage(scratch).digest(confine(path), algorithm=algorithm)
        if actual != expected:
            raise CheckpointError(
                f"the copy of {checkpointer.storage.location(path)} downloaded to {local} has "
                f"{algorithm} {actual}, expected {expected}"
            )
    return local


def resume_point(checkpointer: Checkpointer, scratch: str | os.PathLike[str]) -> Path | None:
    """:func:`resume_choice` and :func:`fetch` in one process: the local path of the job's
    newest verified checkpoint, or None on a fresh start. Main rank only."""
    chosen = resume_choice(checkpointer)
    if chosen is None:
        return None
    local = fetch(checkpointer, chosen, scratch)
    log.info("trainhouse: resuming from %s (step %s)", local, chosen["step"])
    return local
