"""The local executor: one torchrun per job on this machine.

Each attempt is started as ``python -m torch.distributed.run --standalone ...`` (through
:mod:`trainhouse.executors.node.launch`) in a session of its own (its own process group), under
:mod:`trainhouse.executors.node.supervise`, which records the launcher's exit code in the attempt's
directory. The attempt does not depend on the server: a server killed with SIGKILL leaves it
training, and the next server re-adopts it (:meth:`adopt`) by its PID, start time and marker,
and reads its result from that file when it ends. torchrun starts every rank through
:mod:`trainhouse.executors.node.rank`, which sends the rank's stdout and stderr to
``logs/rank-N.log`` and records its exit code. The server learns of an attempt's end when its
supervisor exits (a pidfd, :func:`watch_exit`), not at the scheduler loop's next poll.

torchrun puts each worker in a session of its own too, so a process group signal does not reach
them; every process of an attempt therefore carries ``TRAINHOUSE_RUN_MARKER`` in its environment,
and stopping an attempt signals every process that carries its marker, every process under its
supervisor (a child subreaper: orphans of the attempt become its children, whatever their
session or environment) and, where the machine allows, every process in the attempt's cgroup
(:mod:`trainhouse.executors.node.cgroups`; ``cgroup.kill`` for SIGKILL). The same three find the
attempt's processes for the resource monitor (:meth:`pids`). Nothing survives a stop.

The supervisor is non-dumpable, so its environment cannot be read by the server's user (only by
root): a re-adopted supervisor is recognised by its PID, start time and command line, which
names the attempt's exit file.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, ClassVar

import psutil

from trainhouse.core.cluster import Node
from trainhouse.core.lifecycle import StopReason
from trainhouse.executors.base import Exit, Launch, ProcessInfo
from trainhouse.executors.gpu_release import GpuRelease
from trainhouse.executors.node import cgroups, torchrun
from trainhouse.executors.node.markers import (
    Scan,
    find_marked,
    kill_marked,
    processes,
    scan,
    signal_all,
)
from trainhouse.executors.node.stopping import StopTimer
from trainhouse.executors.node.supervise import read_record, supervised
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.layout import LAUNCHER, AttemptLayout, JobLayout

log = logging.getLogger(__name__)

_OVERDUE = {
    signal.SIGTERM: "did not stop within its grace period: SIGTERM",
    signal.SIGKILL: "is still running after SIGTERM: SIGKILL",
}
PID_SCAN_TTL = 0.5  # seconds one scan of every process's marker serves pids() calls
CGROUP_REMOVE_TIMEOUT = 1.0  # seconds the executor waits for an ended attempt's cgroup to empty


def watch_exit(pid: int, notify: Callable[[], object]) -> bool:
    """Call ``notify`` once process ``pid`` has ended, from a thread blocked on its pidfd (it
    becomes readable when the process ends, before anyone reaps it). False, and nothing
    watched, where the kernel has no pidfds or the process is already gone: the caller's
    polling finds the end all the same, only later."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return False

    def wait() -> None:
        try:
            select.select([fd], [], [])
        except OSError:  # pragma: no cover - the descriptor is ours alone
            pass
        finally:
            os.close(fd)
        try:
            notify()
        except Exception:  # pragma: no cover - the poll finds the end all the same
            log.exception("process %s ended; the callback failed", pid)

    threading.Thread(target=wait, name=f"trainhouse-exit-{pid}", daemon=True).start()
    return True


class _Handle:
    """The launcher of an attempt: ``pid`` and ``poll()`` (its exit code once it has ended)."""

    pid: int

    def poll(self) -> int | None:
        raise NotImplementedError

    def root(self) -> int | None:
        """The supervisor's PID while it is that process (not a PID reused since)."""
        raise NotImplementedError


class _Child(_Handle):
    """An attempt this server started: its supervisor is our child."""

    def __init__(self, proc: subprocess.Popen[bytes], exit_file: Path, home: Path) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.exit_file = exit_file
        self.home = home

    def root(self) -> int | None:
        # our child: its PID is not reused before poll() reaps it
        return self.pid if self.proc.returncode is None else None

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            return None
        recorded = read_record(self.exit_file, within=self.home)
        return recorded[0] if recorded is not None else code


class _Adopted(_Handle):
    """An attempt a previous server started: watched by PID and start time, result from file."""

    def __init__(self, pid: int, proc: psutil.Process | None, exit_file: Path, home: Path) -> None:
        self.proc = proc  # None: it had already ended when the server started
        self.pid = pid
        self.exit_file = exit_file
        self.home = home

    def root(self) -> int | None:
        with contextlib.suppress(psutil.Error):
            if self.proc is not None and self.proc.is_running():  # same PID and start time
                return self.pid
        return None

    def poll(self) -> int | None:
        with contextlib.suppress(psutil.Error):
            if (
                self.proc is not None
                and self.proc.is_running()
                and self.proc.status() != psutil.STATUS_ZOMBIE
            ):
                return None
        recorded = read_record(self.exit_file, within=self.home)
        # no record: the supervisor itself was killed (SIGKILL) before the launcher ended
        return recorded[0] if recorded is not None else -signal.SIGKILL


@dataclass
class _Attempt:
    job_id: int
    number: int
    layout: AttemptLayout
    handle: _Handle
    marker: str
    log_file: IO[bytes] | None
    cgroup: Path | None  # the attempt's cgroup (None: the machine allows none)
    stopping: StopTimer = field(default_factory=StopTimer)
    started: float = field(default_factory=time.monotonic)


class LocalExecutor:
    """Runs every job's ranks as local processes under torchrun."""

    name: ClassVar[str] = "local"
    multi_node: ClassVar[bool] = False

    def __init__(self, node: Node, home: Path) -> None:
        self.node = node
        self.home = home
        self.home_id = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
        self._attempts: dict[int, _Attempt] = {}
        self._lock = threading.RLock()
        self._scan: tuple[float, Scan] | None = None  # (when, scan())
        self._scan_lock = threading.Lock()
        self.gpu_release = GpuRelease(self.home_id)
        # called when an attempt's supervisor ends (the scheduler loop's wake: the end is
        # recorded at once, not at the loop's next poll)
        self._on_exit: Callable[[], object] | None = None
        # a cgroup per attempt where the machine allows it
        self.cgroup_root, why = cgroups.attempt_root()
        if self.cgroup_root is None:
            log.warning(
                "no cgroup per attempt: %s. An attempt's processes are found by their parent "
                "(its supervisor) and marker instead",
                why,
            )
        else:
            log.info("%s", why)

    def notify_exits(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (from another thread) whenever an attempt's supervisor ends, so
        that the next :meth:`poll` reports it without waiting for the caller's interval."""
        self._on_exit = callback

    def _watch(self, pid: int) -> None:
        if self._on_exit is not None:
            watch_exit(pid, self._on_exit)

    def nodes(self) -> list[Node]:
        """This machine without the GPUs a process of an ended attempt still holds
        (:mod:`trainhouse.executors.gpu_release`), which ``held`` explains."""
        with self._lock:
            running = {a.marker for a in self._attempts.values()}
        held = self.gpu_release.held(self.node, running)
        if not held:
            return [self.node]
        gpus = tuple(g for g in self.node.gpus if g.index not in held)
        return [replace(self.node, gpus=gpus, held=tuple(held.values()))]

    def capacity(self) -> list[Node]:
        return [self.node]

    def server_node(self) -> str:
        return self.node.name

    def node_addresses(self, node: str) -> tuple[str, ...]:
        return ()  # its one node is the server's: a replica there listens on loopback

    def marker(self, job_id: int, attempt: int) -> str:
        return f"{self.home_id}:{job_id}:{attempt}"

    def cgroup(self, job_id: int, attempt: int) -> Path | None:
        """The attempt's cgroup (None where this machine allows none)."""
        if self.cgroup_root is None:
            return None
        return self.cgroup_root / f"{cgroups.PREFIX}{self.home_id}-{job_id}-{attempt}"

    def command(self, launch: Launch) -> list[str]:
        return torchrun.command(
            launch.attempt_layout.launcher_exit,
            launch.spec.argv,
            procs=launch.placements[0].procs,
            cgroup=self.cgroup(launch.job_id, launch.attempt),
        )

    def environment(self, launch: Launch, marker: str) -> dict[str, str]:
        return torchrun.rank_environment(
            os.environ,
            torchrun.spec_environment(launch.spec),
            launch.env,
            marker=marker,
            gpus=self.node.visible_ids(launch.placements[0].gpus),
            log_dir=launch.layout.logs,
            attempt=launch.attempt_layout,
            cache=launch.layout.cache,
            environment=(
                launch.environment.with_cache(self.home / "envs")
                if launch.environment is not None
                else None
            ),
            datasets=(
                launch.datasets.with_cache(
                    str(self.home / "datacache"), launch.datasets.cache_bytes
                )
                if launch.datasets is not None
                else None
            ),
        )

    def launch(self, launch: Launch) -> ProcessInfo:
        marker = self.marker(launch.job_id, launch.attempt)
        logs = launch.layout.logs
        logs.mkdir(parents=True, exist_ok=True)
        # torchrun's and the script's temp files stay with the attempt, removed at its end
        launch.attempt_layout.tmp.mkdir(parents=True, exist_ok=True)
        # the previous attempt may have left a link or a FIFO there: neither is opened
        log_file = jobfiles.open_append(launch.layout.home, launch.layout.log(LAUNCHER))
        log_file.write(f"=== trainhouse: attempt {launch.attempt} ===\n".encode())
        log_file.flush()
        try:
            proc = subprocess.Popen(
                self.command(launch),
                cwd=launch.workdir,
                env=self.environment(launch, marker),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        with self._lock:
            self._attempts[launch.job_id] = _Attempt(
                launch.job_id,
                launch.attempt,
                launch.attempt_layout,
                _Child(proc, launch.attempt_layout.launcher_exit, self.home),
                marker,
                log_file,
                self.cgroup(launch.job_id, launch.attempt),
            )
        self._watch(proc.pid)
        try:
            create_time = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            create_time = time.time()
        return ProcessInfo(proc.pid, create_time)

    def adopt(self, job_id: int, attempt: int, info: ProcessInfo) -> bool:
        """Take over an attempt a previous server started. A launcher that still runs (the
        same PID and start time, and the command line of the attempt's supervisor: a reused
        PID is never taken) is watched; one that ended while no server watched it is reported
        by the next ``poll`` with the result it recorded. False when it is gone without a
        record."""
        marker = self.marker(job_id, attempt)
        layout = JobLayout(self.home, job_id).attempt(attempt)
        exit_file = layout.launcher_exit
        proc: psutil.Process | None = None
        cgroup = self.cgroup(job_id, attempt)
        with contextlib.suppress(psutil.Error, OSError):
            candidate = psutil.Process(info.pid)
            found = supervised(candidate.cmdline())
            if (
                abs(candidate.create_time() - info.create_time) < 1.0
                and candidate.status() != psutil.STATUS_ZOMBIE
                and found is not None
                and found[0] == exit_file
            ):
                proc = candidate
                # the previous server's cgroup for it (this one may run in another cgroup)
                if found[1] is not None and found[1].name.startswith(cgroups.PREFIX):
                    cgroup = found[1]
        if proc is None and read_record(exit_file, within=self.home) is None:
            return False
        if cgroup is not None and not cgroup.is_dir():
            cgroup = None
        with self._lock:
            self._attempts[job_id] = _Attempt(
                job_id,
                attempt,
                layout,
                _Adopted(info.pid, proc, exit_file, self.home),
                marker,
                None,
                cgroup,
            )
        if proc is not None:
            self._watch(info.pid)
            log.info("job %s: re-adopted attempt %s (pid %s)", job_id, attempt, info.pid)
        else:
            log.info("job %s: attempt %s ended while the server was down", job_id, attempt)
        return True

    def running(self) -> set[int]:
        with self._lock:
            return set(self._attempts)

    def stop(
        self, job_id: int, *, grace: float, reason: StopReason, terminate: bool = True
    ) -> None:
        """End an attempt. ``terminate``: SIGTERM now, SIGKILL after ``grace``. Otherwise the
        job is expected to notice (its ``should_stop()`` turns true) and exit by itself within
        ``grace``; then SIGTERM, and SIGKILL a few seconds later."""
        now = time.monotonic()
        with self._lock:
            att = self._attempts.get(job_id)
            if att is None:
                return
            if not att.stopping.request(now, grace=grace, reason=reason, terminate=terminate):
                return
            send_now = att.stopping.term_due(now)
        log.info("stopping job %s (%s) within %.0f s", job_id, reason.text, grace)
        if send_now:
            self._signal(att, signal.SIGTERM)

    def _signal(self, att: _Attempt, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(att.handle.pid, sig)
        if att.cgroup is not None:
            cgroups.kill(att.cgroup, sig)
        signal_all(processes(scan().of(att.marker, att.handle.root())), sig)

    def _reap(self, att: _Attempt, code: int) -> Exit:
        # the launcher is gone; no rank of the attempt may outlive it (its supervisor killed
        # what it could; a supervisor that was killed itself could not)
        if att.cgroup is not None:
            cgroups.kill(att.cgroup)
        leftovers = find_marked(att.marker)
        if leftovers:
            signal_all(leftovers, signal.SIGKILL)
            psutil.wait_procs(leftovers, timeout=5)
        if att.cgroup is not None:
            cgroups.remove(att.cgroup, timeout=CGROUP_REMOVE_TIMEOUT)
        if att.log_file is not None:
            with contextlib.suppress(OSError):
                att.log_file.close()
        codes: dict[str, int] = {}
        times: dict[str, float] = {}
        for rank, path in att.layout.rank_exits(within=self.home).items():
            recorded = read_record(path, within=self.home)
            if recorded is not None:
                codes[rank] = recorded[0]
                if recorded[1] is not None:
                    times[rank] = recorded[1]
        with contextlib.suppress(OSError):  # never through a link the job left
            jobfiles.remove(self.home, att.layout.tmp)
        return Exit(att.job_id, att.number, code, codes, att.stopping.reason, times)

    def poll(self) -> list[Exit]:
        exits = []
        now = time.monotonic()
        with self._lock:
            items = list(self._attempts.items())
        for job_id, att in items:
            code = att.handle.poll()
            if code is None:
                for sig in att.stopping.due(now):
                    log.warning("job %s: %s", job_id, _OVERDUE[sig])
                    self._signal(att, sig)
                continue
            with self._lock:
                self._attempts.pop(job_id, None)
            exits.append(self._reap(att, code))
        return exits

    def pids(self, job_id: int) -> list[int]:
        """The attempt's processes: its supervisor and every process under it, those carrying
        its marker, and those in its cgroup. Every process's environment and parent are read
        once per :data:`PID_SCAN_TTL` for all jobs."""
        with self._lock:
            att = self._attempts.get(job_id)
        if att is None:
            return []
        with self._scan_lock:  # not self._lock: the scheduler's poll() need not wait for it
            if self._scan is None or time.monotonic() - self._scan[0] > PID_SCAN_TTL:
                self._scan = (time.monotonic(), scan())
            found = self._scan[1].of(att.marker, att.handle.root())
        if att.cgroup is not None:
            found.extend(pid for pid in cgroups.procs(att.cgroup) if pid not in found)
        return found

    def kill_orphans(self, job_id: int, attempt: int) -> int:
        killed = kill_marked(self.marker(job_id, attempt))
        cgroup = self.cgroup(job_id, attempt)
        if cgroup is not None and cgroup.is_dir():
            killed += cgroups.kill(cgroup)
            cgroups.remove(cgroup, timeout=CGROUP_REMOVE_TIMEOUT)
        return killed

    def shutdown(self, *, grace: float) -> list[Exit]:
        for job_id in self.running():
            self.stop(job_id, grace=grace, reason=StopReason.SHUTDOWN)
        exits: list[Exit] = []
        deadline = time.monotonic() + grace + 10
        while self.running() and time.monotonic() < deadline:
            exits.extend(self.poll())
            time.sleep(0.1)
        self.gpu_release.close()
        return exits
