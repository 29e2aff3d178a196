"""Checkpoints: atomic writes, checksums registered with the server, safe loads.

``save`` and ``load`` are collective: every rank calls them. The main rank writes a replicated
state (``sharded=True``: every rank its shard, with torch.distributed.checkpoint) under a temp
name, publishes it with write/fsync/rename, then writes its sidecar record and registers step,
size and sha256 with the server. ``load`` verifies the checksum and never unpickles arbitrary
objects. Every rank's RNG states go in too, and come back on ``load``. ``blocking=False`` writes
in the background. Where checkpoints go is a :class:`trainhouse.jobfs.storage.Storage` (a local
directory or an fsspec URL).
"""

from trainhouse.sdk.checkpoint._checkpointer import RESERVED, Checkpointer
from trainhouse.sdk.checkpoint._finding import dir_name, file_name
from trainhouse.sdk.checkpoint._handle import SaveHandle
from trainhouse.sdk.checkpoint._safety import load_checkpoint, refuse_unloadable, safe_load
from trainhouse.sdk.checkpoint._support import DISK_FULL

__all__ = [
    "DISK_FULL",
    "RESERVED",
    "Checkpointer",
    "SaveHandle",
    "dir_name",
    "file_name",
    "load_checkpoint",
    "refuse_unloadable",
    "safe_load",
]
