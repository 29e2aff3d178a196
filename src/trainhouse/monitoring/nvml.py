"""NVIDIA's management library (nvidia-ml-py's ``pynvml``), wrapped once for the whole server.

:func:`detect_gpus` is the inventory's view (which GPUs a node offers); :class:`Nvml` is the
sampler's (each GPU's values, and the memory each process holds). Which values are sampled, under
which DCGM name, in which unit and how NVML gives them is one table, :data:`GPU_METRICS`: a new
GPU metric is one entry there, and the sampler, the store and the Prometheus exposition follow.
Without NVIDIA's driver (or nvidia-ml-py) there are no GPUs and no GPU values: nothing is made up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from trainhouse.cluster import Gpu
from trainhouse.monitoring import names

__all__ = ["GPU_METRICS", "GpuMetric", "Nvml", "detect_gpus"]

MIB = 1 << 20


@dataclass(frozen=True)
class GpuMetric:
    """One value sampled per GPU: its series name, its Prometheus help (with the unit), and how
    NVML gives it (``read(pynvml, handle)``; an NVMLError means this GPU does not support it)."""

    name: str
    help: str
    read: Callable[[Any, Any], float]


GPU_METRICS: tuple[GpuMetric, ...] = (
    GpuMetric(
        names.GPU_UTIL,
        "GPU utilization (in %).",
        lambda nv, h: float(nv.nvmlDeviceGetUtilizationRates(h).gpu),
    ),
    GpuMetric(
        names.FB_USED,
        "Framebuffer memory used (in MiB).",
        lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).used / MIB,
    ),
    GpuMetric(
        names.FB_FREE,
        "Framebuffer memory free (in MiB).",
        lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).free / MIB,
    ),
    GpuMetric(
        names.POWER_USAGE,
        "Power draw (in W).",
        lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,  # milliwatts
    ),
    GpuMetric(
        names.GPU_TEMP,
        "GPU temperature (in C).",
        lambda nv, h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
    ),
)


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode()


class Nvml:
    """NVML opened once (per sampler, or for one inventory reading), with a handle per GPU."""

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

    def gpus(self) -> list[Gpu]:
        """Every GPU with its model and memory."""
        out = []
        for index, h in self.handles:
            name = self._get("nvmlDeviceGetName", h)
            mem = self._get("nvmlDeviceGetMemoryInfo", h)
            out.append(
                Gpu(
                    index=index,
                    model=_text(name) if name is not None else "unknown",
                    memory_bytes=int(mem.total) if mem is not None else 0,
                )
            )
        return out

    def sample(self) -> tuple[list[tuple[str, float, int]], dict[int, dict[int, int]]]:
        """Each GPU's values as (name, value, GPU index), and PID -> {GPU index: bytes}."""
        out: list[tuple[str, float, int]] = []
        by_pid: dict[int, dict[int, int]] = {}
        for index, h in self.handles:
            for metric in GPU_METRICS:
                try:
                    value = metric.read(self.nv, h)
                except self.nv.NVMLError:
                    continue
                out.append((metric.name, float(value), index))
            for p in self._get("nvmlDeviceGetComputeRunningProcesses", h) or []:
                used = getattr(p, "usedGpuMemory", None)
                if used is not None:  # None: not available (e.g. WDDM)
                    gpus = by_pid.setdefault(int(p.pid), {})
                    gpus[index] = gpus.get(index, 0) + int(used)
        return out, by_pid


def detect_gpus() -> list[Gpu]:
    """The GPUs NVML sees on this machine; an empty list without NVIDIA's driver."""
    nvml = Nvml.open()
    if nvml is None:
        return []
    try:
        return nvml.gpus()
    finally:
        nvml.close()
