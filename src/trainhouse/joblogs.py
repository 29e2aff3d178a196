"""Reading a job's logs: byte ranges for followers, the last lines for failure reports.

Logs are written by the job's processes (:mod:`trainhouse.layout` says where), so they are
opened through :mod:`trainhouse.jobfiles` from the trusted directory ``within`` (the server's
home, a Ray node agent's directory): a log that is a link (or lies under one), a FIFO, a socket,
a directory or a hard-linked file reads as empty, and the open never waits. The server reads
them through here, never more than ``limit`` bytes at a time. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainhouse import jobfiles

__all__ = ["MAX_READ", "read_log"]

MAX_READ = 4 << 20  # bytes one read returns at most


def read_log(
    path: Path,
    *,
    within: Path,
    offset: int = 0,
    tail: int | None = None,
    limit: int = MAX_READ,
) -> tuple[bytes, int]:
    """Bytes of a log from ``offset`` (or its last ``tail`` lines); returns (data, next).

    ``path`` lies under ``within``, the directory the job cannot replace. A log that does not
    exist (yet), or that is not a regular file reached without a link, reads as empty, at
    offset 0.
    """
    try:
        fh = jobfiles.open_file(within, path)
    except OSError:
        return b"", 0
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if tail is not None:
            start = max(0, size - max(tail, 1) * 512 - 65536)
            fh.seek(start)
            data = fh.read(size - start)
            lines = data.splitlines(keepends=True)
            if start > 0 and lines:
                lines = lines[1:]  # a partial first line
            return b"".join(lines[-tail:] if tail > 0 else []), size
        offset = min(max(offset, 0), size)
        fh.seek(offset)
        data = fh.read(min(limit, size - offset))
        return data, offset + len(data)
