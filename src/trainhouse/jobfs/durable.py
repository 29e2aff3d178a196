"""Durable file writes: data reaches the disk before a name points at it (standard library only).

Used by the server for uploaded archives and by the SDK for checkpoints: write a temp file in the
target directory, fsync it, rename it over the final name, fsync the directory.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


def fsync_tree(path: Path) -> None:
    """fsync every file and directory of the tree ``path`` (before it is renamed into place)."""
    for dirpath, _, names in os.walk(path, topdown=False):
        for name in names:
            fsync_file(Path(dirpath) / name)
        fsync_dir(Path(dirpath))


def publish(tmp: Path, final: Path) -> None:
    """Atomically move a fully written ``tmp`` to ``final`` and make it durable."""
    fsync_file(tmp)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
