"""The executor protocol: a handful of methods the scheduler loop drives."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainhouse.scheduler.resources import Node, Placement
from trainhouse.spec import JobSpec


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one attempt of a job."""

    job_id: int
    attempt: int
    spec: JobSpec
    placements: tuple[Placement, ...]
    workdir: Path  # a fresh extracted copy of the job's archive
    job_dir: Path  # logs/, checkpoints/, attempts/ live here
    env: dict[str, str]  # trainhouse's variables for every rank (URL, job id, token, ...)


@dataclass(frozen=True)
class Exit:
    """An attempt that has ended, with the exit code of each rank that reported one."""

    job_id: int
    attempt: int
    exit_code: int  # the launcher's; negative = killed by that signal
    rank_exit_codes: dict[str, int] = field(default_factory=dict)
    stop_reason: str | None = None  # set when trainhouse stopped it (cancel, max_runtime, ...)
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
    def nodes(self) -> list[Node]:
        """The nodes this executor can place jobs on."""

    def launch(self, launch: Launch) -> ProcessInfo:
        """Start an attempt; returns its launcher process."""

    def adopt(self, job_id: int, attempt: int, info: ProcessInfo, job_dir: Path) -> bool:
        """Watch an attempt a previous server started, if it still runs; False if it does not."""

    def poll(self) -> list[Exit]:
        """Attempts that ended since the last call."""

    def stop(self, job_id: int, *, grace: float, reason: str, terminate: bool = True) -> None:
        """End an attempt: SIGTERM now (unless ``terminate`` is false, when the job is expected
        to stop by itself), SIGKILL to every process after ``grace``."""

    def running(self) -> set[int]:
        """Job ids with a live attempt."""

    def pids(self, job_id: int) -> list[int]:
        """The live processes of a job's current attempt on this executor's nodes (for
        resource monitoring); empty when it has none."""

    def kill_orphans(self, job_id: int, attempt: int) -> int:
        """Kill processes of an attempt this executor no longer tracks; returns how many."""

    def shutdown(self, *, grace: float) -> list[Exit]:
        """Stop every attempt and wait for them; returns their exits."""
