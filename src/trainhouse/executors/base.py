"""The executor protocol: what the scheduler loop, the API and the monitor ask of an executor.

An executor turns a :class:`Launch` (one attempt of a job, placed on nodes) into processes and
reports how each attempt ended as an :class:`Exit`. Two implementations: ``local`` (torchrun on
this machine, :mod:`trainhouse.executors.local`) and ``ray`` (a placement group on a Ray
cluster, :mod:`trainhouse.executors.ray.executor`); :mod:`trainhouse.executors.registry` names them.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from trainhouse.core.cluster import Node, Placements
from trainhouse.core.datasets import StageRequest
from trainhouse.core.envspec import Request
from trainhouse.core.lifecycle import StopReason
from trainhouse.core.spec import JobSpec
from trainhouse.jobfs.layout import AttemptLayout, JobEnv, JobLayout

__all__ = ["Executor", "Exit", "Launch", "ProcessInfo"]


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one attempt of a job."""

    spec: JobSpec
    placements: Placements
    layout: JobLayout  # the job's directory on the server: logs/, attempts/<n>/ (its workdir)
    env: JobEnv  # trainhouse's variables for every rank (URL, job id, credential, ...)
    # the job's environment to set up on each node before torchrun starts (None: the server's
    # Python as it is); its cache is the executor's to fill in
    environment: Request | None = None
    # the dataset versions it pins, staged on each node before torchrun starts (None: none);
    # the node's cache is the executor's to fill in
    datasets: StageRequest | None = None

    @property
    def job_id(self) -> int:
        return self.env.job_id

    @property
    def attempt(self) -> int:
        return self.env.attempt

    @property
    def attempt_layout(self) -> AttemptLayout:
        return self.layout.attempt(self.env.attempt)

    @property
    def workdir(self) -> Path:
        """Where the scheduler unpacked the job's code for this attempt."""
        return self.attempt_layout.workdir


@dataclass(frozen=True)
class Exit:
    """An attempt that has ended, with the exit code of each rank that reported one."""

    job_id: int
    attempt: int
    exit_code: int  # the launcher's; negative = killed by that signal
    rank_exit_codes: dict[str, int] = field(default_factory=dict)
    stop_reason: StopReason | None = None  # set when trainhouse stopped it
    rank_exit_times: dict[str, float] = field(default_factory=dict)
    # the attempt never started (e.g. Ray could not place it in time): the job goes back to
    # the queue with this reason, and no restart is counted
    requeue: str | None = None

    @property
    def failed_rank(self) -> int | None:
        """The rank that failed first: the others are usually torn down because of it.

        A SIGKILLed rank is the cause even when another rank's exit was recorded first: its
        peers fail within milliseconds (gloo: "connection closed by peer"), and on a busy
        machine the killed rank's wrapper may write its record after theirs.
        """
        bad = [r for r, code in self.rank_exit_codes.items() if code != 0]
        killed = [r for r in bad if self.rank_exit_codes[r] == -signal.SIGKILL]
        if not bad:
            return None
        first = min(
            killed or bad, key=lambda r: (self.rank_exit_times.get(r, float("inf")), int(r))
        )
        return int(first)


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    create_time: float


class Executor(Protocol):
    #: the name ``--executor`` takes (see trainhouse.executors.registry)
    name: ClassVar[str]
    #: whether a job may span several nodes
    multi_node: ClassVar[bool]

    def nodes(self) -> list[Node]:
        """The nodes this executor can place jobs on, with what is free for trainhouse now."""

    def capacity(self) -> list[Node]:
        """Every node with everything it has: what a job could ever get (busy or not)."""

    def server_node(self) -> str:
        """The node the server itself runs on (its own resource samples are named by it)."""

    def node_addresses(self, node: str) -> tuple[str, ...]:
        """The addresses the server reaches node ``node`` at (a service's replica there
        listens on one); none where it knows of none (the server's own node: loopback)."""

    def launch(self, launch: Launch) -> ProcessInfo:
        """Start an attempt; returns its launcher process."""

    def adopt(self, job_id: int, attempt: int, info: ProcessInfo) -> bool:
        """Watch an attempt a previous server started, if it still runs; False if it does not."""

    def poll(self) -> list[Exit]:
        """Attempts that ended since the last call."""

    def stop(
        self, job_id: int, *, grace: float, reason: StopReason, terminate: bool = True
    ) -> None:
        """End an attempt: SIGTERM now (unless ``terminate`` is false, when the job is expected
        to stop by itself), SIGKILL to every process after ``grace``."""

    def running(self) -> set[int]:
        """Job ids with a live attempt."""

    def pids(self, job_id: int) -> list[int]:
        """The live processes of a job's current attempt on this executor's nodes (for
        resource monitoring); empty when it has none."""

    def kill_orphans(self, job_id: int, attempt: int) -> int:
        """Kill processes of an attempt this executor no longer tracks; returns how many."""

    # Optional: ``notify_exits(callback)``. An executor that can tell when an attempt ends
    # calls ``callback`` (from any thread) then, and the scheduler loop, which passes its
    # ``wake``, polls at once instead of at its next tick (the local executor has it).

    def shutdown(self, *, grace: float) -> list[Exit]:
        """Stop every attempt and wait for them; returns their exits."""
