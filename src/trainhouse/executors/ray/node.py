"""The node side of the Ray executor: one :class:`NodeAgent` actor per bundle of a job's
placement group, and the guard that outlives it.

The agent runs the same process tree on its node that the local executor runs on the server's
machine: :mod:`trainhouse.executors.node.supervise` (records torchrun's exit code), torchrun for
this node (``--nnodes N --node-rank i``, static rendezvous on node 0) and one
:mod:`trainhouse.executors.node.rank` wrapper per rank, in a session of their own, every process
carrying the attempt's marker for this node. Everything lives in a directory of the agent's own on
the node's disk (``--ray-node-dir``, by default ``$TMPDIR/trainhouse-ray``): the unpacked workdir,
``logs/`` and the attempt directory (exit records, spooled metrics, ``TMPDIR``). The server reads it
through :meth:`NodeAgent.status`, which returns what the logs grew by since the offsets the server
has, the exit records once torchrun has ended, and spooled metrics; the directory is removed by
:meth:`NodeAgent.finish`. The ranks write into it, so the agent reads it through
:mod:`trainhouse.jobfs.jobfiles` from its own directory: no link is followed, only regular files are
read (a FIFO cannot block the agent), spooled batches up to the server's caps.

Nothing may outlive the agent. Ray kills a dead worker's children, but not their children
(torchrun and the ranks live in a session of their own), so every agent starts a guard
(``python -m trainhouse.executors.ray.node guard FD MARKER``), detached from it (not its child)
and holding the read end of a pipe whose write end only the agent holds: when the agent dies in
any way (``ray.kill``, its node's raylet gone, SIGKILL), the pipe reads EOF and the guard kills
every process that carries the node's marker and removes the agent's directory. Imports
neither Ray nor anything heavy at module level: the guard starts in a blink.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from trainhouse.core.datasets import StageRequest
from trainhouse.core.envspec import Request
from trainhouse.executors.node import torchrun
from trainhouse.executors.node.markers import kill_marked
from trainhouse.executors.node.supervise import read_record
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.layout import LAUNCHER_LOG, MARKER_ENV, AttemptLayout, JobEnv

CHUNK = 1 << 20  # bytes of one log returned by one status call at most


def boot_id() -> str:
    """This kernel's boot id: two Ray nodes with the same one are the same machine."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


CACHES = "caches"  # under the node's directory: one per job (the compilers' caches)
ENVS = "envs"  # under the node's directory: the jobs' environments (trainhouse.core.envspec)
DATACACHE = "datacache"  # under the node's directory: staged dataset versions
CACHE_IDLE = 7 * 86400.0  # seconds a job's caches stay on a node unused


def prune_caches(directory: Path, *, keep: Path, idle: float = CACHE_IDLE) -> int:
    """Remove the jobs' caches in ``directory`` not used for ``idle`` seconds (a job's cache is
    touched whenever one of its attempts starts here), except ``keep``; how many went. A node
    does not know when a job has ended for good: age is what tells."""
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        try:
            if entry.path == str(keep) or not entry.is_dir(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < idle:
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    return removed


def interface_of(ip: str) -> str | None:
    """The network interface that holds the address ``ip`` (None where none does)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%", 1)[0] == ip for a in addresses):
            return name
    return None


def socket_interfaces(ip: str, env: dict[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` for the interface of this node's Ray
    address, each unless ``env`` (the ranks' environment so far: the node's own and the
    spec's) sets it. Without them gloo binds to whatever the hostname resolves to (127.0.1.1 on
    many distributions, unreachable from other nodes) and NCCL may pick another network."""
    name = interface_of(ip)
    if name is None:
        return {}
    return {k: name for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k not in env}


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, 0))
        except OSError:
            sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


class NodeAgent:
    """One node of one attempt (wrapped with ``ray.remote`` by the executor)."""

    def __init__(self, root: str | None, tag: str, marker: str, cache: str = "") -> None:
        import tempfile

        self.default_base = not root
        base = Path(root) if root else Path(tempfile.gettempdir()) / "trainhouse-ray"
        self.root = base / tag
        # the job's compilers' caches on this node, kept across its attempts (``cache`` names
        # it: one per job and server; the attempt's own directory without one)
        self.cache = base / CACHES / cache if cache else self.root / "cache"
        self.marker = marker
        self.ip = ""  # this node's Ray address, known once prepared
        self.proc: subprocess.Popen[bytes] | None = None
        self.guard_fd: int | None = None
        self.started_at: float | None = None
        self.reaped = False

    # -- paths -----------------------------------------------------------------------------
    @property
    def workdir(self) -> Path:
        return self.root / "workdir"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def attempt(self) -> AttemptLayout:
        return AttemptLayout(self.root / "attempt")

    # -- start -----------------------------------------------------------------------------
    def prepare(self, archive: bytes) -> dict[str, Any]:
        """Unpack the job's code; returns where this node is (and a free port for node 0's
        rendezvous), its GPUs as Ray assigned them, and its boot id."""
        import importlib

        from trainhouse.jobfs.workdir import extract

        ray: Any = importlib.import_module("ray")

        if self.root.exists():
            shutil.rmtree(self.root)
        self.attempt.tmp.mkdir(parents=True)
        self.logs.mkdir()
        packed = self.root / "workdir.tar.gz"
        packed.write_bytes(archive)
        extract(packed, self.workdir)
        packed.unlink()
        prune_caches(self.cache.parent, keep=self.cache)
        self.cache.mkdir(parents=True, exist_ok=True)
        os.utime(self.cache)  # in use: not pruned for CACHE_IDLE from now
        ip = ray.util.get_node_ip_address()
        self.ip = ip
        return {
            "ip": ip,
            "port": free_port(ip),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
            "boot_id": boot_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }

    def start(
        self,
        argv: list[str],
        spec_env: dict[str, str],
        job: JobEnv,
        gpus: list[str],
        *,
        procs: int,
        nodes: int,
        node_rank: int,
        master: tuple[str, int],
        environment: str | None = None,
        datasets: str | None = None,
    ) -> int:
        """Start the guard, then the supervisor of torchrun for node ``node_rank`` of
        ``nodes`` (rendezvous at ``master``) running ``argv`` in each of ``procs`` ranks, with
        the spec's environment ``spec_env`` and trainhouse's ``job``; returns the supervisor's
        PID. ``environment``: the job's environment request (JSON, :mod:`trainhouse.core.envspec`),
        built by the supervisor in this node's cache (``envs/`` beside the attempts);
        ``datasets``: the versions it pins (JSON, :class:`~trainhouse.core.datasets.StageRequest`),
        staged by the supervisor in this node's cache (``datacache/`` beside them)."""
        if self.proc is not None:
            return self.proc.pid
        read_end, write_end = os.pipe()  # not inheritable: only the guard gets the read end
        try:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "trainhouse.executors.ray.node",
                    "guard",
                    str(read_end),
                    self.marker,
                    str(self.root),
                    *([str(self.root.parent)] if self.default_base else []),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(read_end,),
                env={k: v for k, v in os.environ.items() if k != MARKER_ENV},
                check=True,
                timeout=60,
            )
        finally:
            os.close(read_end)
        self.guard_fd = write_end
        full = torchrun.rank_environment(
            os.environ,
            spec_env,
            job,
            marker=self.marker,
            gpus=gpus,
            log_dir=self.logs,
            attempt=self.attempt,
            cache=self.cache,
            drop_prefixes=("RAY_",),
            pci_order=False,  # Ray's GPU ids follow the node's order (inherited), not NVML's
            environment=(
                Request.from_json(environment).with_cache(self.root.parent / ENVS)
                if environment
                else None
            ),
            datasets=(
                StageRequest.from_json(datasets).with_cache(
                    str(self.root.parent / DATACACHE), StageRequest.from_json(datasets).cache_bytes
                )
                if datasets
                else None
            ),
            node_address=self.ip,  # a service's replica listens where the server reaches it
        )
        full.update(socket_interfaces(self.ip, full) if self.ip else {})
        cmd = torchrun.command(
            self.attempt.launcher_exit,
            argv,
            procs=procs,
            nodes=nodes,
            node_rank=node_rank,
            master=master,
        )
        with (self.logs / LAUNCHER_LOG).open("ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.time()
        return self.proc.pid

    # -- watch -----------------------------------------------------------------------------
    def status(self, offsets: dict[str, int], want_pids: bool = False) -> dict[str, Any]:
        """What happened since the server's ``offsets`` (bytes of each log it has).

        ``ended``: torchrun's supervisor has exited; ``launcher``: its (code, time);
        ``ranks``: each rank's (code, time) once ended; ``logs``: name -> (offset, bytes), the
        launcher's in whole lines until the end; ``complete``: ended and every log returned to
        its end, with ``spool`` holding the metric batches the ranks could not send."""
        code = self.proc.poll() if self.proc is not None else None
        ended = code is not None
        if ended and not self.reaped:
            # torchrun is gone; no rank of this node may outlive it (as the local executor)
            self.reaped = True
            kill_marked(self.marker)
        out: dict[str, Any] = {"started": self.proc is not None, "ended": ended}
        logs, complete = self._read_logs(offsets, ended)
        complete = complete and ended
        out["logs"] = logs
        if ended:
            assert code is not None
            recorded = read_record(self.attempt.launcher_exit, within=self.root)
            out["launcher"] = recorded if recorded is not None else (code, time.time())
            ranks = {}
            for rank, path in self.attempt.rank_exits(within=self.root).items():
                rec = read_record(path, within=self.root)
                if rec is not None:
                    ranks[rank] = rec
            out["ranks"] = ranks
        out["complete"] = complete
        if complete:
            out["spool"] = self._read_spool()
        if want_pids:
            out["pids"] = self.pids()
        return out

    def _read_logs(
        self, offsets: dict[str, int], ended: bool
    ) -> tuple[dict[str, tuple[int, bytes]], bool]:
        """What each log (a regular file, reached without a link) grew by past ``offsets``,
        at most :data:`CHUNK` each; and whether every one was read to its end."""
        logs: dict[str, tuple[int, bytes]] = {}
        complete = True
        try:
            d = jobfiles.open_dir(self.root, self.logs)
        except OSError:
            return logs, complete
        with d:
            try:
                names = [n for n, st in d.entries() if stat.S_ISREG(st.st_mode)]
            except OSError:
                return logs, complete
            for name in names:
                offset = offsets.get(name, 0)
                try:
                    with d.open_file(name) as fh:
                        size = os.fstat(fh.fileno()).st_size
                        if size <= offset:
                            continue
                        fh.seek(offset)
                        data = fh.read(min(CHUNK, size - offset))
                except OSError:
                    continue
                if offset + len(data) < size:
                    complete = False
                if name == LAUNCHER_LOG and not ended:
                    data = data[: data.rfind(b"\n") + 1]
                if data:
                    logs[name] = (offset, data)
        return logs, complete

    def _read_spool(self) -> dict[str, bytes]:
        """The metric batches the ranks spooled: regular ``*.json`` files reached without a
        link, each of at most ``MAX_SPOOL_FILE`` bytes, at most ``MAX_SPOOL_FILES`` of them and
        ``MAX_SPOOL_TOTAL`` bytes in all (the server's caps)."""
        found: dict[str, bytes] = {}
        try:
            d = jobfiles.open_dir(self.root, self.attempt.spool)
        except OSError:
            return found
        budget = jobfiles.MAX_SPOOL_TOTAL
        with d:
            try:
                entries = d.entries()
            except OSError:
                return found
            for name, st in entries:
                if not name.endswith(".json") or not stat.S_ISREG(st.st_mode):
                    continue
                if len(found) >= jobfiles.MAX_SPOOL_FILES or st.st_size > budget:
                    break
                try:
                    data = d.read(name, max_size=min(jobfiles.MAX_SPOOL_FILE, budget))
                except OSError:
                    continue
                budget -= len(data)
                found[name] = data
        return found

    def pids(self) -> list[int]:
        """The supervisor and every process under it (torchrun, the ranks, their children)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            top = psutil.Process(self.proc.pid)
            return [top.pid, *(p.pid for p in top.children(recursive=True))]
        except psutil.Error:
            return []

    # -- stop ------------------------------------------------------------------------------
    def signal(self, sig: int) -> int:
        """``sig`` to the supervisor's session and every process with this node's marker."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
        return kill_marked(self.marker, sig) if sig != signal.SIGKILL else self._kill()

    def _kill(self) -> int:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        return kill_marked(self.marker)

    def finish(self) -> int:
        """Kill whatever is left, release the guard and remove the node's directory; returns
        how many processes had to be killed."""
        killed = self._kill()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        if self.guard_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.guard_fd)
            self.guard_fd = None
        shutil.rmtree(self.root, ignore_errors=True)
        if self.default_base:
            with contextlib.suppress(OSError):
                self.root.parent.rmdir()  # trainhouse-ray, once no attempt uses it
        return killed


def guard(fd: int, marker: str, root: Path, parent: Path | None = None) -> int:
    """Detach from the agent (fork; the parent returns at once, so the guard is nobody's
    child), wait for the pipe to close, then kill every process carrying ``marker`` and remove
    the agent's directory ``root`` (and ``parent``, if that leaves it empty): an agent that
    died without :meth:`NodeAgent.finish` leaves nothing behind either."""
    if os.fork() > 0:
        return 0
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            if not os.read(fd, 4096):
                break
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        except OSError:
            break
    for _ in range(3):  # a rank may be forking as we look
        if not kill_marked(marker):
            break
    shutil.rmtree(root, ignore_errors=True)
    if parent is not None:
        with contextlib.suppress(OSError):
            parent.rmdir()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) in (4, 5) and argv[0] == "guard":
        parent = Path(argv[4]) if len(argv) == 5 else None
        return guard(int(argv[1]), argv[2], Path(argv[3]), parent)
    print(
        "usage: python -m trainhouse.executors.ray.node guard FD MARKER DIR [PARENT]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
