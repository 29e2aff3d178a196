"""The on-disk layout of a job under the server's home, and safe reads of its logs.

::

    HOME/jobs/<id>/logs/rank-<N>.log       every rank's stdout+stderr, across attempts
    HOME/jobs/<id>/logs/launcher.log       torchrun's own output
    HOME/jobs/<id>/checkpoints/            written by the SDK, registered with the server
    HOME/jobs/<id>/attempts/<n>/workdir/   a fresh copy of the uploaded code per attempt
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_LOG_NAME = re.compile(r"^rank-(\d+)\.log$")


@dataclass(frozen=True)
class JobFiles:
    home: Path
    job_id: int

    @property
    def root(self) -> Path:
        return self.home / "jobs" / str(self.job_id)

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def attempt(self, number: int) -> Path:
        return self.root / "attempts" / str(number)

    def log(self, rank: int | str) -> Path:
        name = "launcher.log" if rank == "launcher" else f"rank-{int(rank)}.log"
        return self.logs / name

    def ranks(self) -> list[int]:
        if not self.logs.is_dir():
            return []
        found = (_LOG_NAME.match(p.name) for p in self.logs.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def read_log(
        self,
        rank: int | str,
        *,
        offset: int = 0,
        tail: int | None = None,
        limit: int = 4 << 20,
    ) -> tuple[bytes, int]:
        """Bytes of a log from ``offset`` (or its last ``tail`` lines); returns (data, next)."""
        path = self.log(rank)
        if not path.is_file():
            return b"", 0
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
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

    def tail_text(self, rank: int | str, lines: int = 5) -> str:
        data, _ = self.read_log(rank, tail=lines)
        return data.decode(errors="replace").rstrip()

    def checkpoint_path(self, name: str) -> Path | None:
        """The checkpoint file ``name`` inside this job's directory, or None if it escapes."""
        path = (self.checkpoints / name).resolve()
        root = self.checkpoints.resolve()
        if path.parent != root and root not in path.parents:
            return None
        return path
