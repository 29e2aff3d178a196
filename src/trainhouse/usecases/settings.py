"""Server settings: where state lives, what to listen on, what this machine offers.

:class:`Settings` holds every default and every rule of the server's configuration:
``trainhouse server`` builds one from its options and reports what :meth:`Settings.validate`
refuses; tests and embedders build one directly.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args
from urllib.parse import urlsplit

from trainhouse.core.envspec import DEFAULT_CACHE_SIZE, Defaults
from trainhouse.executors import registry
from trainhouse.ingest.groupcommit import QUEUE_POINTS
from trainhouse.jobfs.hardening import read_private_file
from trainhouse.jobfs.workdir import MAX_ARCHIVE_BYTES
from trainhouse.scheduler.failures import DEFAULT_MAX_INFRA_RESTARTS
from trainhouse.scheduler.fairshare import DEFAULT_HALF_LIFE

DEFAULT_PORT = 8470
LOOPBACK = ("127.0.0.1", "localhost", "::1")
EVERYWHERE = ("0.0.0.0", "", "::")  # listening on every address of the machine
# a DNS name (labels of letters, digits and hyphens) as --allowed-host takes it
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
Visibility = Literal["own", "list", "all"]
VISIBILITIES: tuple[str, ...] = get_args(Visibility)


def default_home() -> Path:
    return Path(os.environ.get("TRAINHOUSE_HOME") or Path.home() / ".trainhouse").expanduser()


@dataclass
class Settings:
    home: Path
    db_url: str | None = None
    # a file holding the database URL (mode 0600 or stricter; "-": standard input), read once
    # on first use instead of db_url, so the password is in no command line or environment
    db_file: str | None = None
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
    max_infra_restarts: int = DEFAULT_MAX_INFRA_RESTARTS
    checkpoint_url: str | None = None  # None: HOME/jobs/<id>/checkpoints
    monitor_interval: float = 5.0  # seconds between resource samples; 0 turns sampling off
    monitor_retention: float = 7 * 86400.0  # seconds resource samples are kept
    log_retention: float | None = None  # seconds logs outlive their job; None: forever
    ray_address: str | None = None  # the Ray cluster's GCS address (--executor ray)
    ray_placement_timeout: float = 60.0  # seconds Ray gets to place a job's group
    ray_node_dir: str | None = None  # where the nodes unpack code and keep logs (node-local)
    shared_home: bool = False  # every node mounts HOME at the same path (shared checkpoints)
    advertise_url: str | None = None  # the URL ranks on other machines reach the server at
    # more names the server answers to in the Host header (--allowed-host): the name a reverse
    # proxy forwards, or the machine's name on the network; see host_names
    allowed_hosts: tuple[str, ...] = ()
    # auth: None = on unless the server listens on loopback only (--auth forces it on there);
    # off on another address only with insecure_no_auth (--insecure-no-auth)
    auth: bool | None = None
    insecure_no_auth: bool = False
    # what non-admins see of other users' jobs: "own" nothing, "list" the job list (names,
    # owners, states), "all" everything read-only (logs, metrics, checkpoints)
    job_visibility: Visibility = "own"
    auth_failures: int = 10  # failed token uses per client address and window before 429
    auth_window: float = 60.0  # seconds
    # open log streams (GET /jobs/{id}/logs/stream) per user and in all; past either, 429
    log_streams_per_user: int = 8
    log_streams: int = 64
    # metric reports: stored in group commits (trainhouse.ingest.groupcommit), many requests in
    # one transaction; False: one transaction per report in the request's thread (the path
    # before group commit, kept for comparison: bench/load.py --baseline)
    report_group_commit: bool = True
    # writer threads (a job always goes to the same one); None: 1 on SQLite (one writer at a
    # time anyway), 4 on PostgreSQL
    report_writers: int | None = None
    # metric points queued per writer at most before reports get 503 (Retry-After)
    report_queue_points: int = QUEUE_POINTS
    # MLflow artifacts (PUT /mlflow/api/2.0/mlflow-artifacts/artifacts/...): one file's bytes at
    # most, and a run's together
    mlflow_artifact_bytes: int = 1 << 30
    mlflow_run_artifact_bytes: int = 8 << 30
    # seconds between two looks at running jobs' TensorBoard event files; 0 turns it off
    tensorboard_interval: float = 2.0
    # job environments (trainhouse.core.envspec): the index options a spec's environment gets unless
    # it gives its own (credentials in them never reach a job's logs), and the cache's size per node
    env_index_url: str | None = None
    env_extra_index_urls: tuple[str, ...] = ()
    env_find_links: tuple[str, ...] = ()
    env_cache_size: int = DEFAULT_CACHE_SIZE
    # datasets (trainhouse.core.datasets): the server's dataset storage (uploaded versions and
    # --copy copies; None: HOME/datasets), each node's cache of staged versions and its size
    # (0: no limit), the largest upload, the directories a file:// source may lie in, and
    # whether an http(s) source may name a loopback or private address
    dataset_storage: Path | None = None
    dataset_cache_bytes: int = 100 << 30
    dataset_upload_bytes: int = 8 << 30
    dataset_file_roots: tuple[Path, ...] = ()
    dataset_allow_private: bool = False
    # the bytes a model version's files may hold together (what a job saved, a checkpoint
    # registered with --loader) and a checkpoint `clone --from-checkpoint` copies: past them
    # a registration or a clone is refused before any byte is read (a sparse file counts its
    # apparent size)
    model_max_bytes: int = 256 << 30
    clone_max_bytes: int = 256 << 30
    # jobs' files hashed or copied for requests (model registrations, clones), never on the
    # API's threads: at once, server-wide, and waiting at most before a 503 (Retry-After)
    file_workers: int = 2
    file_queue: int = 16
    _db_file_url: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def env_defaults(self) -> Defaults:
        return Defaults(
            self.env_index_url, self.env_extra_index_urls, self.env_find_links, self.env_cache_size
        )

    @property
    def env_cache(self) -> Path:
        """This machine's cache of job environments."""
        return self.home / "envs"

    @property
    def datasets_home(self) -> Path:
        """The server's dataset storage: uploaded versions' files and manifests."""
        return self.dataset_storage or self.home / "datasets"

    @property
    def dataset_cache(self) -> Path:
        """This machine's cache of staged dataset versions (a node's, on Ray)."""
        return self.home / "datacache"

    @property
    def auth_enabled(self) -> bool:
        if self.insecure_no_auth:
            return False
        if self.auth is not None:
            return self.auth
        return self.host not in LOOPBACK

    def validate(self) -> None:
        """Raise ValueError, naming the option and the value, for settings the server cannot
        run with: the executor's own checks (:mod:`trainhouse.executors.registry`), auth, and
        every number's range."""
        if self.db_url and self.db_file:
            raise ValueError(
                "give the database as --db (TRAINHOUSE_DB) or --db-file (TRAINHOUSE_DB_FILE), "
                "not both"
            )
        self.database_url  # noqa: B018 - reads --db-file now, refusing a file others can read
        if self.job_visibility not in VISIBILITIES:
            raise ValueError(
                f"--job-visibility must be own, list or all; got {self.job_visibility!r}"
            )
        self.check_auth()
        self.check_hosts()
        registry.check(self)
        for option, value, low in (
            ("--cancel-grace", self.cancel_grace, 0.0),
            ("--max-infra-restarts", self.max_infra_restarts, 0),
            ("--monitor-interval", self.monitor_interval, 0.0),
            ("--fairshare-half-life", self.fairshare_half_life, 1e-9),
            ("--auth-failures", self.auth_failures, 1),
            ("log_streams_per_user", self.log_streams_per_user, 1),
            ("log_streams", self.log_streams, 1),
            ("report_writers", self.report_writers or 1, 1),
            ("report_queue_points", self.report_queue_points, 1),
            ("--env-cache-size", self.env_cache_size, 0),
            ("--dataset-cache-bytes", self.dataset_cache_bytes, 0),
            ("--dataset-upload-bytes", self.dataset_upload_bytes, 1),
            ("--model-max-bytes", self.model_max_bytes, 1),
            ("--clone-max-bytes", self.clone_max_bytes, 1),
            ("file_workers", self.file_workers, 1),
            ("file_queue", self.file_queue, 0),
        ):
            if value < low:
                raise ValueError(f"{option} must be >= {low:g}, got {value:g}")
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be 1 to 65535, got {self.port}")

    def check_auth(self) -> None:
        """Refuse a server that would listen beyond this machine with nobody checked."""
        if self.insecure_no_auth and self.auth:
            raise ValueError("--auth and --insecure-no-auth contradict each other")
        if self.auth is False and self.host not in LOOPBACK and not self.insecure_no_auth:
            raise ValueError(
                f"the server would listen on {self.host} with auth off; anyone who reaches "
                "it could run code on this machine. Keep auth on, listen on 127.0.0.1, or "
                "pass --insecure-no-auth if something in front of it authenticates users"
            )

    def check_hosts(self) -> None:
        """Refuse an ``--allowed-host`` that is not a host name or an IP address, and an
        ``--advertise-url`` that is not an http(s) URL with a host."""
        for name in self.allowed_hosts:
            if not _is_host(name):
                raise ValueError(
                    "--allowed-host takes a host name or an IP address, without scheme, port or "
                    f"path (e.g. trainhouse.example.com); got {name!r}"
                )
        if self.advertise_url is not None:
            try:
                parts = urlsplit(self.advertise_url)
                host = parts.hostname
                parts.port  # noqa: B018  (a port that is not a number raises)
            except ValueError:
                host = None
            if parts.scheme not in ("http", "https") or not host:
                raise ValueError(
                    "--advertise-url must be an http:// or https:// URL with a host "
                    f"(e.g. http://head-node:8470); got {self.advertise_url!r}"
                )

    @property
    def listens_everywhere(self) -> bool:
        """Whether the server listens on every address of the machine (0.0.0.0, ::)."""
        return self.host in EVERYWHERE

    @property
    def host_names(self) -> frozenset[str]:
        """The names the server answers to in a request's ``Host`` header (lower case, without
        port): the address it listens on and ``localhost``; 127.0.0.1 and ::1 when it listens
        on the loopback or on every address; the host of ``--advertise-url``; every
        ``--allowed-host``. A server behind a reverse proxy that forwards ``Host`` (nginx's
        ``proxy_set_header Host $host``) needs the public name among them. On every address, any
        IP address is taken besides (:mod:`trainhouse.server.origin`)."""
        names = {self.host.strip("[]").lower(), "localhost"}
        if self.host in LOOPBACK or self.listens_everywhere:
            names |= {"127.0.0.1", "::1"}
        if self.advertise_url:
            advertised = urlsplit(self.advertise_url).hostname
            if advertised:
                names.add(advertised.lower())
        names |= {name.strip("[]").lower() for name in self.allowed_hosts}
        names.discard("")
        return frozenset(names)

    @property
    def shared_checkpoints(self) -> bool:
        """Whether every node reaches the checkpoint storage (a URL, a shared directory, or
        a HOME every node mounts): multi-node jobs need it."""
        return self.checkpoint_url is not None or self.shared_home

    @property
    def database_url(self) -> str:
        """``db_url``; else the URL in ``db_file`` (read on first use, then kept; ValueError
        if the file cannot be read or others may read it); else SQLite under ``home``."""
        if self.db_url:
            return self.db_url
        if self.db_file is not None:
            if self._db_file_url is None:
                self._db_file_url = read_private_file(self.db_file, "--db-file")
            return self._db_file_url
        return f"sqlite:///{self.home / 'trainhouse.db'}"

    @property
    def url(self) -> str:
        """The URL worker processes use to reach the server (``--advertise-url``, or this
        machine's address)."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = self.host
        if host in EVERYWHERE:
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


def _is_host(name: str) -> bool:
    """A host name (``trainhouse.example.com``) or an IP address (``10.0.0.5``, ``::1`` or
    ``[::1]``)."""
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        return bare == name and _HOST_NAME.fullmatch(name.lower()) is not None
    return True
