"""Sharded checkpoints: every rank writes its shard with torch.distributed.checkpoint (DCP).

A sharded checkpoint is a directory ``step-XXXXXXXXX/`` holding DCP's files plus
``trainhouse-rng.pt`` (every rank's RNG states, written by the main rank). It is written under a
temp name and renamed once every rank's shard is on disk, so a crash never leaves a directory
that looks complete.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from typing import Any

from trainhouse.jobfs.storage import Storage
from trainhouse.sdk.checkpoint._safety import check_dcp_metadata, safe_load

RNG_FILE = "trainhouse-rng.pt"
METADATA = ".metadata"


def _writer(storage: Storage, rel: str) -> Any:
    local = storage.local_path(rel)
    if local is not None:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        return FileSystemWriter(str(local), sync_files=True)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(storage.location(rel), sync_files=True)


def _reader(storage: Storage, rel: str) -> Any:
    local = storage.local_path(rel)
    if local is not None:
        from torch.distributed.checkpoint.filesystem import FileSystemReader

        return FileSystemReader(str(local))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(storage.location(rel))


@contextlib.contextmanager
def _quiet(no_dist: bool) -> Iterator[None]:
    """DCP warns on every single-process call that it assumes a single process: it is meant."""
    if not no_dist:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*single process")
        yield


def save_shards(state: dict[str, Any], storage: Storage, rel: str, group: Any) -> None:
    """This rank's part of ``state`` into the directory ``rel``: collective over ``group``, or
    alone with None, even where the script initialized a process group of its own (a world
    of one: DCP would use it from the thread of a background save while training uses it)."""
    from torch.distributed.checkpoint import state_dict_saver

    no_dist = group is None
    with _quiet(no_dist):
        state_dict_saver.save(
            state, storage_writer=_writer(storage, rel), process_group=group, no_dist=no_dist
        )


def load_shards(state: dict[str, Any], storage: Storage, rel: str, group: Any) -> None:
    """Fill ``state`` in place from the sharded checkpoint ``rel``: collective over ``group``
    (the checkpoints' gloo group, whose timeout allows for slow reads), or alone with None."""
    from torch.distributed.checkpoint import state_dict_loader

    # DCP unpickles its metadata with plain pickle: check it with an allow-list first
    check_dcp_metadata(storage.read_bytes(f"{rel}/{METADATA}"))
    no_dist = group is None
    with _quiet(no_dist):
        state_dict_loader.load(
            state, storage_reader=_reader(storage, rel), process_group=group, no_dist=no_dist
        )


def write_rng(storage: Storage, rel: str, states: list[Any]) -> None:
    import torch

    with storage.open_write(f"{rel}/{RNG_FILE}") as fh:
        torch.save({"rng": states}, fh)


def read_rng(storage: Storage, rel: str) -> Any:
    name = f"{rel}/{RNG_FILE}"
    if not storage.exists(name):
        return None
    return safe_load(io.BytesIO(storage.read_bytes(name))).get("rng")
