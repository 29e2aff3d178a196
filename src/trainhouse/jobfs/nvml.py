"""NVIDIA's management library (nvidia-ml-py's ``pynvml``), wrapped once for the whole server.

:func:`detect_gpus` is the inventory's view (which GPUs a node offers); :class:`Nvml` is the
sampler's (each GPU's values, and the memory each process holds). Which values are sampled, under
which DCGM name, in which unit and how NVML gives them is one table, :data:`GPU_METRICS`: a new
GPU metric is one entry there, and the sampler, the store and the Prometheus exposition follow.
Without NVIDIA's driver (or nvidia-ml-py) there are no GPUs and no GPU values: nothing is made up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from trainhouse.core import metricnames as names
from trainhouse.core.cluster import Gpu

__all__ = ["GPU_METRICS", "Device", "GpuMetric", "Nvml", "detect_gpus", "parse_mask"]

log = logging.getLogger(__name__)

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


NO_INSTANCE = 0xFFFFFFFF  # NVML's gpuInstanceId/computeInstanceId of a process off MIG


@dataclass(frozen=True)
class Device:
    """A device NVML sees: a whole GPU (``parent`` None), or a MIG instance of GPU ``parent``
    (with its GPU and compute instance IDs)."""

    gpu: Gpu
    handle: Any
    parent: Device | None = None
    instance: tuple[int, int] | None = None  # (gpuInstanceId, computeInstanceId)


class Nvml:
    """NVML opened once (per sampler, or for one inventory reading), with a handle per GPU.

    A GPU with MIG on is not offered whole: its MIG instances are, each with its ``MIG-…`` UUID and
    its memory, numbered after the machine's GPUs (see :class:`~trainhouse.core.cluster.Gpu`).
    ``mask`` (the server's own ``CUDA_VISIBLE_DEVICES``, parsed by :func:`parse_mask`) limits what
    is offered and sampled to the devices it names."""

    def __init__(
        self, nv: ModuleType, handles: list[tuple[int, Any]], mask: list[str] | None = None
    ) -> None:
        self.nv = nv
        self.handles = handles
        self.devices = self._select(self._inventory(), mask)
        offered = {d.gpu.parent if d.parent else d.gpu.index for d in self.devices}
        self.sampled = [(i, h) for i, h in handles if i in offered]

    @classmethod
    def open(cls, mask: list[str] | None = None) -> Nvml | None:
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
            nvml = cls(pynvml, handles, mask) if handles else None
        except Exception:
            log.warning("NVML could not list the GPUs", exc_info=True)
            nvml = None
        if nvml is None:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
        return nvml

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()

    def _get(self, function: str, *args: Any) -> Any:
        """One NVML query; None where this GPU does not support it (or it failed)."""
        try:
            return getattr(self.nv, function)(*args)
        except self.nv.NVMLError:
            return None

    def _gpu(self, handle: Any, index: int, parent: int | None = None) -> Gpu:
        name = self._get("nvmlDeviceGetName", handle)
        mem = self._get("nvmlDeviceGetMemoryInfo", handle)
        uuid = self._get("nvmlDeviceGetUUID", handle)
        return Gpu(
            index=index,
            model=_text(name) if name is not None else "unknown",
            memory_bytes=int(mem.total) if mem is not None else 0,
            uuid=_text(uuid) if uuid is not None else "",
            parent=parent,
        )

    def _inventory(self) -> list[Device]:
        """Every whole GPU, and every MIG instance of the GPUs with MIG on (after them)."""
        whole: list[Device] = []
        instances: list[tuple[Device, Any, tuple[int, int]]] = []
        for index, h in self.handles:
            device = Device(self._gpu(h, index), h)
            whole.append(device)
            mode = self._get("nvmlDeviceGetMigMode", h)  # [current, pending]; unsupported: None
            if not mode or mode[0] != getattr(self.nv, "NVML_DEVICE_MIG_ENABLE", 1):
                continue
            for slot in range(self._get("nvmlDeviceGetMaxMigDeviceCount", h) or 0):
                mig = self._get("nvmlDeviceGetMigDeviceHandleByIndex", h, slot)
                if mig is None:  # NotFound: no instance in this slot
                    continue
                gi = self._get("nvmlDeviceGetGpuInstanceId", mig)
                ci = self._get("nvmlDeviceGetComputeInstanceId", mig)
                instances.append((device, mig, (int(gi or 0), int(ci or 0))))
        first = max((d.gpu.index for d in whole), default=-1) + 1
        out = [d for d in whole if not any(parent is d for parent, _, _ in instances)]
        for k, (parent, mig, ids) in enumerate(instances):
            gpu = self._gpu(mig, first + k, parent.gpu.index)
            out.append(Device(gpu, mig, parent, ids))
        return out

    @staticmethod
    def _select(devices: list[Device], mask: list[str] | None) -> list[Device]:
        if mask is None:
            return devices
        chosen: list[Device] = []
        for entry in mask:
            found = [d for d in devices if _names(d, entry)]
            if not found:
                log.warning(
                    "CUDA_VISIBLE_DEVICES entry %r names no GPU NVML sees; CUDA ignores it and "
                    "every entry after it, and so does trainhouse",
                    entry,
                )
                break
            chosen.extend(d for d in found if d not in chosen)
        return sorted(chosen, key=lambda d: d.gpu.index)

    def gpus(self) -> list[Gpu]:
        """Every GPU (or MIG instance) offered, with its model, memory and UUID."""
        return [d.gpu for d in self.devices]

    def sample(self) -> tuple[list[tuple[str, float, int]], dict[int, dict[int, int]]]:
        """Each sampled GPU's values as (name, value, GPU index), and PID -> {GPU index: bytes}
        (a process on a MIG instance counts on the instance's index)."""
        out: list[tuple[str, float, int]] = []
        by_pid: dict[int, dict[int, int]] = {}
        for index, h in self.sampled:
            for metric in GPU_METRICS:
                try:
                    value = metric.read(self.nv, h)
                except self.nv.NVMLError:
                    continue
                out.append((metric.name, float(value), index))
            for pid, gpu, used in self._processes(index, h):
                if used is not None:  # None: not available (e.g. WDDM)
                    gpus = by_pid.setdefault(pid, {})
                    gpus[gpu] = gpus.get(gpu, 0) + used

        return out, by_pid

    def _processes(self, index: int, handle: Any) -> list[tuple[int, int, int | None]]:
        """(PID, GPU index, bytes or None) of each compute process on a physical GPU."""
        migs = {d.instance: d.gpu.index for d in self.devices if d.parent and d.gpu.parent == index}
        out = []
        for p in self._get("nvmlDeviceGetComputeRunningProcesses", handle) or []:
            used = getattr(p, "usedGpuMemory", None)
            ids = (getattr(p, "gpuInstanceId", NO_INSTANCE), getattr(p, "computeInstanceId", 0))
            out.append((int(p.pid), migs.get(ids, index), None if used is None else int(used)))
        return out

    def holders(self, gpu_indices: Iterable[int]) -> dict[int, set[int]]:
        """The PIDs of the compute processes on each of these GPUs (or MIG instances), as NVML
        reports them: GPU index -> PIDs."""
        wanted = set(gpu_indices)
        out: dict[int, set[int]] = {i: set() for i in wanted}
        for index, h in self.handles:
            for pid, gpu, _ in self._processes(index, h):
                if gpu in wanted:
                    out[gpu].add(pid)
        return out


def _names(device: Device, entry: str) -> bool:
    """Whether a ``CUDA_VISIBLE_DEVICES`` entry names this device (or the GPU it is part of):
    an NVML index, a unique prefix of a ``GPU-…`` or ``MIG-…`` UUID, or the older
    ``MIG-GPU-<uuid>/<gpu instance>/<compute instance>``."""
    whole = device.parent.gpu if device.parent else device.gpu
    if entry.isdigit():
        return int(entry) == whole.index
    if entry.startswith("MIG-GPU-") and device.instance is not None:
        uuid, _, ids = entry[len("MIG-") :].partition("/")
        return whole.uuid == uuid and ids == "{}/{}".format(*device.instance)
    if entry.startswith("MIG-"):
        return device.parent is not None and device.gpu.uuid.startswith(entry)
    return entry.startswith("GPU-") and whole.uuid.startswith(entry)


def parse_mask(value: str | None) -> list[str] | None:
    """A ``CUDA_VISIBLE_DEVICES`` value as its entries (None when unset: every GPU). An empty
    value, or one that starts with ``-1``, hides every GPU, as it does from CUDA."""
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",")]
    out: list[str] = []
    for e in entries:
        if not e or e.startswith("-"):
            break
        out.append(e)
    return out


def detect_gpus(mask: list[str] | None = None) -> list[Gpu]:
    """The GPUs NVML sees on this machine that ``mask`` names (all of them without one); an
    empty list without NVIDIA's driver."""
    if mask == []:
        return []
    nvml = Nvml.open(mask)
    if nvml is None:
        return []
    try:
        return nvml.gpus()
    finally:
        nvml.close()
