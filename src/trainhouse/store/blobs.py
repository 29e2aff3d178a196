"""Content-addressed storage of uploaded workdir archives (``blobs/sha256/ab/abcd...``)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from trainhouse.jobfs.durable import fsync_dir


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "sha256").mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        return self.root / "sha256" / digest[:2] / digest

    def put(
        self, stream: BinaryIO, max_bytes: int, check: Callable[[Path], None] | None = None
    ) -> tuple[str, int]:
        """Store a stream durably; returns (sha256, size). Raises ValueError past max_bytes.
        ``check`` sees the written file before it is stored: whatever it raises leaves
        nothing behind (a refused upload never fills the disk)."""
        hasher = hashlib.sha256()
        size = 0
        tmp_dir = self.root / "tmp"
        tmp_dir.mkdir(exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=tmp_dir)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(1 << 20):
                    size += len(chunk)
                    if size > max_bytes:
                        raise ValueError(f"archive is over the {max_bytes >> 20} MiB limit")
                    hasher.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if check is not None:
                check(tmp)
            digest = hasher.hexdigest()
            final = self.path(digest)
            final.parent.mkdir(exist_ok=True)
            if final.exists():
                tmp.unlink()
            else:
                os.replace(tmp, final)
                fsync_dir(final.parent)
            return digest, size
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
