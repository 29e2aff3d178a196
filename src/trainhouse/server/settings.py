"""Server settings: where state lives, what to listen on, what this machine offers."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainhouse.scheduler.fairshare import DEFAULT_HALF_LIFE
from trainhouse.workdir import MAX_ARCHIVE_BYTES

DEFAULT_PORT = 8470


def default_home() -> Path:
    return Path(os.environ.get("TRAINHOUSE_HOME") or Path.home() / ".trainhouse").expanduser()


@dataclass
class Settings:
    home: Path
    db_url: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    cpus: int | None = None
    gpus: str | None = None
    executor: str = "local"
    cancel_grace: float = 10.0
    shutdown_grace: float = 10.0
    max_upload_bytes: int = MAX_ARCHIVE_BYTES
    tick: float = 0.5
    quota_gpus: int | None = None  # default per-user caps on concurrent GPUs / CPU cores
    quota_cpus: int | None = None
    fairshare_half_life: float = DEFAULT_HALF_LIFE
    max_infra_restarts: int = 20
    checkpoint_url: str | None = None  # None: HOME/jobs/<id>/checkpoints

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'trainhouse.db'}"

    @property
    def url(self) -> str:
        """The URL worker processes on this machine use to reach the server."""
        host = self.host
        if host in ("0.0.0.0", "", "::"):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"
