"""The resource sampler: a thread that records what this node and each running job use.

Every ``interval`` seconds (``trainhouse server --monitor-interval``, 5 s by default; 0 turns it
off) one sample batch is stored in ``system_metrics`` (:mod:`trainhouse.store.system` has the
names and units):

- the node: CPU percent of all cores, memory used (total - available) and total, and for each
  GPU NVML sees, DCGM's ``DCGM_FI_DEV_GPU_UTIL``, ``_FB_USED``, ``_FB_FREE`` (MiB),
  ``_POWER_USAGE`` (W) and ``_GPU_TEMP`` (C), labelled by the GPU's NVML index;
- each running job: its attempt's processes (the executor's :meth:`pids`), their summed CPU
  percent (of one core) and RSS, how many there are, and per GPU the memory NVML attributes to
  those PIDs.

Without NVIDIA's driver (or nvidia-ml-py) there is no GPU part at all: nothing is made up.
Samples older than the retention are deleted every few minutes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from types import ModuleType
from typing import Any

import psutil

from trainhouse.executors.base import Executor
from trainhouse.store import system as names
from trainhouse.store.system import Sample, SystemMetrics

log = logging.getLogger(__name__)

RETENTION_EVERY = 300.0  # seconds between two deletions of samples past the retention
MIB = 1 << 20


class Nvml:
    """NVIDIA's management library (nvidia-ml-py's ``pynvml``), opened once per sampler."""

    def __init__(self, nv: ModuleType, handles: list[tuple[int, Any]]) -> None:
        self.nv = nv
        self.handles = handles

    @classmethod
    def open(cls) -> Nvml | None:
        """None where there is no usable NVIDIA driver or no GPU."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except Exception:  # NVMLError (no driver, no library), OSError
            return None
        try:
            handles = [
                (i, pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
        except Exception:
            handles = []
        if not handles:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            return None
        return cls(pynvml, handles)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()

    def _get(self, function: str, *args: Any) -> Any:
        """One NVML query; None where this GPU does not support it (or it failed)."""
        try:
            return getattr(self.nv, function)(*args)
        except self.nv.NVMLError:
            return None

    def sample(self) -> tuple[list[Sample], dict[int, dict[int, int]]]:
        """Each GPU's values under DCGM's names, and PID -> {GPU index: bytes it uses}."""
        out: list[Sample] = []
        by_pid: dict[int, dict[int, int]] = {}
        for index, h in self.handles:
            util = self._get("nvmlDeviceGetUtilizationRates", h)
            if util is not None:
                out.append(Sample(names.GPU_UTIL, float(util.gpu), index))
            mem = self._get("nvmlDeviceGetMemoryInfo", h)
            if mem is not None:
                out.append(Sample(names.FB_USED, mem.used / MIB, index))
                out.append(Sample(names.FB_FREE, mem.free / MIB, index))
            power = self._get("nvmlDeviceGetPowerUsage", h)  # milliwatts
            if power is not None:
                out.append(Sample(names.POWER_USAGE, power / 1000.0, index))
            temp = self._get("nvmlDeviceGetTemperature", h, self.nv.NVML_TEMPERATURE_GPU)
            if temp is not None:
                out.append(Sample(names.GPU_TEMP, float(temp), index))
            for p in self._get("nvmlDeviceGetComputeRunningProcesses", h) or []:
                used = getattr(p, "usedGpuMemory", None)
                if used is not None:  # None: not available (e.g. WDDM)
                    gpus = by_pid.setdefault(int(p.pid), {})
                    gpus[index] = gpus.get(index, 0) + int(used)
        return out, by_pid


def _busy_idle(times: Any) -> tuple[float, float]:
    # guest time is already counted in user and nice on Linux
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total, times.idle + getattr(times, "iowait", 0.0)


_UNOPENED = object()


class Sampler:
    """Samples this node and its running jobs every ``interval`` seconds, in a thread."""

    def __init__(
        self,
        system: SystemMetrics,
        executor: Executor,
        *,
        node: str,
        interval: float = 5.0,
        retention: float = 7 * 86400.0,
        retention_every: float = RETENTION_EVERY,
    ) -> None:
        self.system = system
        self.executor = executor
        self.node = node
        self.interval = interval
        self.retention = retention  # seconds; <= 0 keeps samples forever
        self.retention_every = retention_every
        self._nvml: Any = _UNOPENED
        self._cpu_times: tuple[float, float] | None = None
        self._proc_cpu: dict[int, tuple[float, float, float]] = {}  # pid -> (created, cpu s, t)
        self._purged_at = -math.inf
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    # -- life ------------------------------------------------------------------------------
    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="trainhouse-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if isinstance(self._nvml, Nvml):
            self._nvml.close()
        self._nvml = _UNOPENED

    def _run(self) -> None:
        while not self._stopping.is_set():
            began = time.monotonic()
            try:
                self.tick()
            except Exception:  # keep sampling; the error is in the server log
                log.exception("resource sampling failed")
            self._stopping.wait(max(self.interval - (time.monotonic() - began), 0.05))

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
            self._nvml = Nvml.open()
        nvml: Nvml | None = self._nvml
        return nvml

    def sample(self) -> list[Sample]:
        """One sample of the node and of every running job (not stored)."""
        out = self._node()
        by_pid: dict[int, dict[int, int]] = {}
        nvml = self.gpus()
        if nvml is not None:
            gpu_samples, by_pid = nvml.sample()
            out.extend(gpu_samples)
        seen: set[int] = set()
        for job_id in sorted(self.executor.running()):
            pids = self.executor.pids(job_id)
            seen.update(pids)
            out.extend(self._job(job_id, pids, by_pid))
        for pid in set(self._proc_cpu) - seen:
            del self._proc_cpu[pid]
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

    def _job(self, job_id: int, pids: list[int], by_pid: dict[int, dict[int, int]]) -> list[Sample]:
        cpu = rss = 0.0
        count = 0
        gpu_mem: dict[int, int] = {}
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
            for gpu, used_bytes in by_pid.get(pid, {}).items():
                gpu_mem[gpu] = gpu_mem.get(gpu, 0) + used_bytes
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
