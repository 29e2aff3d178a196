"""Where a job's files live and what its processes are told: one spelling for both sides.

The server writes a job's directory and its processes read and write it; the executors start
those processes with the environment described here, and the SDK and the rank wrapper read it
back. Each name below is defined once and used by every writer and reader::

    HOME/jobs/<id>/logs/rank-<N>.log            every rank's stdout+stderr, across attempts
    HOME/jobs/<id>/logs/launcher.log            torchrun's own output
    HOME/jobs/<id>/checkpoints/                 written by the SDK, registered with the server
    HOME/jobs/<id>/cache/                       compilers' caches, kept across attempts
    HOME/jobs/<id>/tensorboard/                 TensorBoard event files (TRAINHOUSE_TENSORBOARD_DIR)
    HOME/jobs/<id>/artifacts/                   artifacts (MLflow's, run.log_artifact's)
    HOME/jobs/<id>/attempts/<n>/workdir/        a fresh copy of the uploaded code per attempt
    HOME/jobs/<id>/attempts/<n>/tmp/            TMPDIR of the attempt's processes
    HOME/jobs/<id>/attempts/<n>/exit-launcher   "CODE TIME" of torchrun (its supervisor writes it)
    HOME/jobs/<id>/attempts/<n>/exit-rank-<N>   "CODE TIME" of each rank (its wrapper writes it)
    HOME/jobs/<id>/attempts/<n>/finished-rank-<N>  the rank's run ended cleanly (the SDK writes it)
    HOME/jobs/<id>/attempts/<n>/metrics-spool/  metric batches the SDK could not send

A Ray node keeps the same attempt layout under a directory of its own (``--ray-node-dir``).

:class:`JobEnv` is the environment trainhouse gives every rank (``TRAINHOUSE_*``): built by the
scheduler loop, completed by the executor with the node's directories, read by the SDK
(:meth:`JobEnv.from_env`). Standard library and :mod:`trainhouse.jobfs.jobfiles` only: the rank
wrapper imports this at start-up.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainhouse.jobfs import jobfiles

__all__ = [
    "LAUNCHER",
    "LAUNCHER_EXIT",
    "LAUNCHER_LOG",
    "MARKER_ENV",
    "SPOOL_DIR",
    "AttemptLayout",
    "JobEnv",
    "JobLayout",
    "log_name",
    "rank_of_log",
    "times_name",
]

#: the launcher's "rank" where a rank is asked for (logs, failure analysis)
LAUNCHER = "launcher"
LAUNCHER_LOG = "launcher.log"
LAUNCHER_EXIT = "exit-launcher"
RANK_EXIT_PREFIX = "exit-rank-"
#: the SDK's word that a rank of a multi-rank run finished cleanly, its process group left
#: (the rank wrapper reads it: trainhouse.executors.node.rank.teardown_abort)
RANK_FINISHED_PREFIX = "finished-rank-"
SPOOL_DIR = "metrics-spool"
#: every process of an attempt carries this variable (see trainhouse.executors.node.markers)
MARKER_ENV = "TRAINHOUSE_RUN_MARKER"

_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")


def log_name(rank: int | str) -> str:
    """``rank-3.log`` for rank 3, ``launcher.log`` for the launcher."""
    return LAUNCHER_LOG if rank == LAUNCHER else f"rank-{int(rank)}.log"


#: the time index next to a rank's log (written by the rank wrapper, read by
#: trainhouse.jobfs.joblogs)
TIMES_SUFFIX = ".times"


def times_name(rank: int | str) -> str:
    """``rank-3.log.times``: when each piece of ``rank-3.log`` was written."""
    return log_name(rank) + TIMES_SUFFIX


def rank_of_log(name: str) -> int | None:
    """The rank a log file name belongs to (None for the launcher's or anything else)."""
    match = _RANK_LOG.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class AttemptLayout:
    """One attempt's directory: exit records, spooled metrics, temp files, its code."""

    dir: Path

    @property
    def workdir(self) -> Path:
        return self.dir / "workdir"

    @property
    def tmp(self) -> Path:
        return self.dir / "tmp"

    @property
    def spool(self) -> Path:
        return self.dir / SPOOL_DIR

    @property
    def launcher_exit(self) -> Path:
        return self.dir / LAUNCHER_EXIT

    def rank_exit(self, rank: int | str) -> Path:
        return self.dir / f"{RANK_EXIT_PREFIX}{rank}"

    def rank_finished(self, rank: int | str) -> Path:
        return self.dir / f"{RANK_FINISHED_PREFIX}{rank}"

    def rank_exits(self, *, within: Path) -> dict[str, Path]:
        """Rank (as text) -> its exit record, for every rank that wrote one (a regular file),
        listed from ``within`` (above the attempt's directory) without following a link."""
        try:
            with jobfiles.open_dir(within, self.dir) as d:
                names = [n for n, st in d.entries() if stat.S_ISREG(st.st_mode)]
        except OSError:
            return {}
        return {
            name.removeprefix(RANK_EXIT_PREFIX): self.dir / name
            for name in names
            if name.startswith(RANK_EXIT_PREFIX)
        }


@dataclass(frozen=True)
class JobLayout:
    """A job's directory under the server's home."""

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

    @property
    def cache(self) -> Path:
        """The compilers' caches of every attempt (removed when the job ends)."""
        return self.root / "cache"

    @property
    def tensorboard(self) -> Path:
        """Where the job's processes write TensorBoard event files (imported as metrics)."""
        return self.root / TENSORBOARD_DIR

    @property
    def artifacts(self) -> Path:
        """The job's artifacts: MLflow's and ``run.log_artifact``'s (the server writes them:
        server/mlflow; read through jobfs/artifacts)."""
        return self.root / "artifacts"

    def attempt(self, number: int) -> AttemptLayout:
        return AttemptLayout(self.root / "attempts" / str(number))

    def log(self, rank: int | str) -> Path:
        return self.logs / log_name(rank)

    def log_times(self, rank: int | str) -> Path:
        return self.logs / times_name(rank)

    def ranks(self) -> list[int]:
        """Ranks that have a log (a regular file, no link on the way), in order."""
        try:
            with jobfiles.open_dir(self.home, self.logs) as d:
                names = [n for n, st in d.entries() if stat.S_ISREG(st.st_mode)]
        except OSError:
            return []
        found = (rank_of_log(name) for name in names)
        return sorted(r for r in found if r is not None)

    def has_log(self, rank: int | str) -> bool:
        """True when ``rank`` (or the launcher) has a log: a regular file, no link on the way."""
        return jobfiles.is_file(self.home, self.log(rank))


# -- the environment of a job's processes ------------------------------------------------------
URL_ENV = "TRAINHOUSE_URL"
JOB_ID_ENV = "TRAINHOUSE_JOB_ID"
JOB_NAME_ENV = "TRAINHOUSE_JOB_NAME"
ATTEMPT_ENV = "TRAINHOUSE_ATTEMPT"
JOB_TOKEN_ENV = "TRAINHOUSE_JOB_TOKEN"
TOKEN_ENV = "TRAINHOUSE_TOKEN"
HPARAMS_ENV = "TRAINHOUSE_HPARAMS"
CHECKPOINT_DIR_ENV = "TRAINHOUSE_CHECKPOINT_DIR"
CHECKPOINT_URL_ENV = "TRAINHOUSE_CHECKPOINT_URL"
LOG_DIR_ENV = "TRAINHOUSE_LOG_DIR"
ATTEMPT_DIR_ENV = "TRAINHOUSE_ATTEMPT_DIR"
TENSORBOARD_ENV = "TRAINHOUSE_TENSORBOARD_DIR"
# the world size of the job's previous attempt (unset on its first): an elastic job resized
PREVIOUS_WORLD_ENV = "TRAINHOUSE_PREVIOUS_WORLD_SIZE"
#: the address other machines reach a rank's node at, where its executor knows one (Ray's: the
#: node's IP); a service's replica listens there (unset: on loopback, the server's own node)
NODE_ADDRESS_ENV = "TRAINHOUSE_NODE_ADDRESS"
TENSORBOARD_DIR = "tensorboard"  # next to the node's logs directory
#: MLflow's own variables: a script that logs through MLflow logs to its job
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_RUN_ENV = "MLFLOW_RUN_ID"
MLFLOW_TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8470"


def mlflow_uri(url: str, job_id: int) -> str:
    """The MLflow tracking URI of a job: MLflow's API scoped to the job, where every run the
    script makes is the job itself (clients that ignore MLFLOW_RUN_ID land there too)."""
    return f"{url.rstrip('/')}/mlflow/jobs/{int(job_id)}"


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class JobEnv:
    """What trainhouse tells every process of an attempt, as ``TRAINHOUSE_*`` variables.

    ``checkpoints`` is a local directory or a URL (``s3://...``, ``file://...``); ``log_dir``
    and ``attempt_dir`` are the node's own, set by the executor that starts the processes.
    """

    url: str
    job_id: int
    job_name: str
    attempt: int
    token: str
    checkpoints: str
    hparams: dict[str, Any] = field(default_factory=dict)
    log_dir: str | None = None
    attempt_dir: str | None = None
    previous_world_size: int | None = None  # the previous attempt's, if there was one

    def on_node(self, log_dir: Path | str, attempt_dir: Path | str) -> JobEnv:
        """This environment with a node's log and attempt directories."""
        return replace(self, log_dir=str(log_dir), attempt_dir=str(attempt_dir))

    def to_env(self) -> dict[str, str]:
        env = {
            URL_ENV: self.url,
            JOB_ID_ENV: str(self.job_id),
            JOB_NAME_ENV: self.job_name,
            ATTEMPT_ENV: str(self.attempt),
            JOB_TOKEN_ENV: self.token,
            # the ambient identity inside a job is the job: a Client() made by the script acts
            # with the job's credential, which reaches this job only
            TOKEN_ENV: self.token,
            HPARAMS_ENV: json.dumps(self.hparams),
            CHECKPOINT_URL_ENV if "://" in self.checkpoints else CHECKPOINT_DIR_ENV: (
                self.checkpoints
            ),
            # MLflow attaches to the job: its run id is the job's id, its token the job's
            MLFLOW_URI_ENV: mlflow_uri(self.url, self.job_id),
            MLFLOW_RUN_ENV: str(self.job_id),
            MLFLOW_TOKEN_ENV: self.token,
        }
        if self.log_dir is not None:
            env[LOG_DIR_ENV] = self.log_dir
            env[TENSORBOARD_ENV] = str(Path(self.log_dir).parent / TENSORBOARD_DIR)
        if self.attempt_dir is not None:
            env[ATTEMPT_DIR_ENV] = self.attempt_dir
        if self.previous_world_size is not None:
            env[PREVIOUS_WORLD_ENV] = str(self.previous_world_size)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobEnv | None:
        """The job this process belongs to, or None outside the server (no job id set)."""
        environ = os.environ if environ is None else environ
        job = environ.get(JOB_ID_ENV)
        if not job:
            return None
        return cls(
            url=environ.get(URL_ENV, DEFAULT_URL),
            job_id=int(job),
            job_name=environ.get(JOB_NAME_ENV, ""),
            attempt=_int(environ, ATTEMPT_ENV, 1),
            token=environ.get(JOB_TOKEN_ENV, ""),
            checkpoints=(
                environ.get(CHECKPOINT_URL_ENV) or environ.get(CHECKPOINT_DIR_ENV) or "checkpoints"
            ),
            hparams=json.loads(environ.get(HPARAMS_ENV) or "{}"),
            log_dir=environ.get(LOG_DIR_ENV),
            attempt_dir=environ.get(ATTEMPT_DIR_ENV),
            previous_world_size=_int(environ, PREVIOUS_WORLD_ENV, 0) or None,
        )

    @property
    def attempt_layout(self) -> AttemptLayout | None:
        return AttemptLayout(Path(self.attempt_dir)) if self.attempt_dir else None


def is_job_variable(name: str) -> bool:
    """A variable trainhouse or torchrun sets for a rank: never inherited from the server."""
    return name.startswith("TRAINHOUSE_") or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
