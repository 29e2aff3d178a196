"""The resource sampler: a service that records what this node and each running job use.

Every ``interval`` seconds (``trainhouse server --monitor-interval``, 5 s by default; 0 turns it
off) one sample batch is stored in ``system_metrics`` (:mod:`trainhouse.core.metricnames` has the
names and units):

- the node: CPU percent of all cores, memory used (total - available) and total, and for each
  GPU NVML sees, every value of :data:`trainhouse.jobfs.nvml.GPU_METRICS` (DCGM's
  ``DCGM_FI_DEV_GPU_UTIL``, ``_FB_USED``, ``_FB_FREE`` (MiB), ``_POWER_USAGE`` (W) and
  ``_GPU_TEMP`` (C)), labelled by the GPU's NVML index;
- each running job: its attempt's processes (the executor's :meth:`pids`), their summed CPU
  percent (of one core) and RSS, how many there are, and per GPU the memory NVML attributes to
  those PIDs.

NVML gives the PIDs of the namespace the driver sees, not always the server's: a process is
matched under each PID ``/proc/<pid>/status`` gives it (``NSpid``: the server's namespace and
every one nested in it), and where NVML names a process the server cannot see at all (a server in
a container without the host's PID namespace sees none of the host PIDs NVML gives), its memory
counts for the job the GPU is allocated to (``allocations``).

Without NVIDIA's driver (or nvidia-ml-py) there is no GPU part at all: nothing is made up.
Samples older than the retention are deleted every few minutes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from trainhouse.core import metricnames as names
from trainhouse.core.background import BackgroundLoop
from trainhouse.executors.base import Executor
from trainhouse.jobfs.nvml import Nvml
from trainhouse.store.system import Sample, SystemMetrics

__all__ = ["Nvml", "Sampler"]

log = logging.getLogger(__name__)

RETENTION_EVERY = 300.0  # seconds between two deletions of samples past the retention


def _busy_idle(times: Any) -> tuple[float, float]:
    # guest time is already counted in user and nice on Linux
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total, times.idle + getattr(times, "iowait", 0.0)


_UNOPENED = object()


def nspids(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """``pid`` and its PID in each PID namespace nested in ours that it belongs to (the
    ``NSpid`` line of its status; just ``pid`` where there is none, or it ended)."""
    try:
        with open(proc / str(pid) / "status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [pid, *(int(v) for v in line.split()[2:] if v.isdigit())]
    except OSError:
        pass
    return [pid]


class Sampler(BackgroundLoop):
    """Samples this node and its running jobs every ``interval`` seconds, in a thread."""

    name = "trainhouse-monitor"

    def __init__(
        self,
        system: SystemMetrics,
        executor: Executor,
        *,
        node: str,
        interval: float = 5.0,
        retention: float = 7 * 86400.0,
        retention_every: float = RETENTION_EVERY,
        allocations: Callable[[], Mapping[int, Iterable[int]]] | None = None,
        gpu_mask: list[str] | None = None,
    ) -> None:
        super().__init__(interval)
        self.system = system
        self.executor = executor
        self.node = node
        self.allocations = allocations  # running job -> its GPU indices on this node
        self.gpu_mask = gpu_mask  # the server's CUDA_VISIBLE_DEVICES: only those GPUs sampled
        self.retention = retention  # seconds; <= 0 keeps samples forever
        self.retention_every = retention_every
        self._nvml: Any = _UNOPENED
        self._cpu_times: tuple[float, float] | None = None
        self._proc_cpu: dict[int, tuple[float, float, float]] = {}  # pid -> (created, cpu s, t)
        self._purged_at = -math.inf

    @property
    def enabled(self) -> bool:
        return bool(self.interval and self.interval > 0)

    # -- life ------------------------------------------------------------------------------
    def on_stop(self) -> None:
        if isinstance(self._nvml, Nvml):
            self._nvml.close()
        self._nvml = _UNOPENED

    def next_wait(self, elapsed: float) -> float:
        return (self.interval or 0.0) - elapsed  # a sample every interval, however long it took

    def tick(self) -> list[Sample]:
        """Take one sample, store it, and delete samples past the retention when it is time."""
        at = time.time()
        samples = self.sample()
        self.system.write(self.node, at, samples)
        if self.retention > 0 and time.monotonic() - self._purged_at >= self.retention_every:
            self._purged_at = time.monotonic()
            deleted = self.system.purge(at - self.retention)
            if deleted:
                log.info("deleted %d resource samples older than %.0f s", deleted, self.retention)
        return samples

    # -- sampling --------------------------------------------------------------------------
    def gpus(self) -> Nvml | None:
        if self._nvml is _UNOPENED:
            self._nvml = Nvml.open(self.gpu_mask)
        nvml: Nvml | None = self._nvml
        return nvml

    def sample(self) -> list[Sample]:
        """One sample of the node and of every running job (not stored)."""
        out = self._node()
        by_pid: dict[int, dict[int, int]] = {}
        nvml = self.gpus()
        if nvml is not None:
            gpu_values, by_pid = nvml.sample()
            out.extend(Sample(name, value, gpu) for name, value, gpu in gpu_values)
        seen: set[int] = set()
        jobs = {job_id: self.executor.pids(job_id) for job_id in sorted(self.executor.running())}
        gpu_memory = self._gpu_memory(jobs, by_pid) if by_pid else {}
        for job_id, pids in jobs.items():
            seen.update(pids)
            out.extend(self._job(job_id, pids, gpu_memory.get(job_id, {})))
        for pid in set(self._proc_cpu) - seen:
            del self._proc_cpu[pid]
        return out

    def _gpu_memory(
        self, jobs: Mapping[int, list[int]], by_pid: Mapping[int, Mapping[int, int]]
    ) -> dict[int, dict[int, int]]:
        """Job -> {GPU index: bytes}: NVML's processes matched to the jobs' by any of their
        PIDs, the processes of PIDs the server cannot see by the GPU's allocation."""
        owner = {a: job_id for job_id, pids in jobs.items() for p in pids for a in nspids(p)}
        out: dict[int, dict[int, int]] = {}
        foreign: dict[int, int] = {}  # GPU -> bytes of processes outside our PID namespace
        for pid, gpus in by_pid.items():
            job_id = owner.get(pid)
            if job_id is None:
                if not psutil.pid_exists(pid):
                    for gpu, used in gpus.items():
                        foreign[gpu] = foreign.get(gpu, 0) + used
                continue
            mine = out.setdefault(job_id, {})
            for gpu, used in gpus.items():
                mine[gpu] = mine.get(gpu, 0) + used
        if foreign and self.allocations is not None:
            holders: dict[int, list[int]] = {}
            for job_id, allocated in self.allocations().items():
                for gpu in allocated:
                    holders.setdefault(gpu, []).append(job_id)
            for gpu, used in foreign.items():
                if len(holders.get(gpu, [])) == 1:
                    mine = out.setdefault(holders[gpu][0], {})
                    mine[gpu] = mine.get(gpu, 0) + used
        return out

    def _node(self) -> list[Sample]:
        if self._cpu_times is None:  # no earlier reading: measure over a short window
            self._cpu_times = _busy_idle(psutil.cpu_times())
            time.sleep(0.1)
        total, idle = _busy_idle(psutil.cpu_times())
        d_total, d_idle = total - self._cpu_times[0], idle - self._cpu_times[1]
        self._cpu_times = (total, idle)
        cpu = min(max(100.0 * (1.0 - d_idle / d_total), 0.0), 100.0) if d_total > 0 else 0.0
        mem = psutil.virtual_memory()
        return [
            Sample(names.CPU_PERCENT, cpu),
            Sample(names.MEMORY_USED, float(mem.total - mem.available)),
            Sample(names.MEMORY_TOTAL, float(mem.total)),
        ]

    def _job(self, job_id: int, pids: list[int], gpu_mem: Mapping[int, int]) -> list[Sample]:
        cpu = rss = 0.0
        count = 0
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    created = proc.create_time()
                    times = proc.cpu_times()
                    resident = proc.memory_info().rss
            except (psutil.Error, OSError):
                continue  # ended meanwhile
            now = time.monotonic()
            used = times.user + times.system
            prev = self._proc_cpu.get(pid)
            if prev is not None and prev[0] == created and now > prev[2]:
                cpu += 100.0 * max(used - prev[1], 0.0) / (now - prev[2])
            else:  # first seen: its average over its life so far
                cpu += 100.0 * used / max(time.time() - created, 1e-3)
            self._proc_cpu[pid] = (created, used, now)
            rss += resident
            count += 1
        if not count:
            return []
        out = [
            Sample(names.CPU_PERCENT, cpu, job_id=job_id),
            Sample(names.RSS, rss, job_id=job_id),
            Sample(names.PROCESSES, float(count), job_id=job_id),
        ]
        out.extend(
            Sample(names.GPU_MEMORY, float(b), gpu, job_id) for gpu, b in sorted(gpu_mem.items())
        )
        return out
