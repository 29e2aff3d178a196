"""What this machine offers: CPU cores, memory and GPUs (nvidia-ml-py when present)."""

from __future__ import annotations

import contextlib
import os
import socket

import psutil

from trainhouse.cluster import Gpu, Node


def detect_gpus() -> list[Gpu]:
    """GPUs NVML can see; an empty list on a machine without NVIDIA's driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver / no library: a CPU-only machine
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                Gpu(
                    index=i,
                    model=name if isinstance(name, str) else name.decode(),
                    memory_bytes=int(mem.total),
                )
            )
        return gpus
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def parse_gpus(value: str) -> list[Gpu]:
    """``--gpus 2`` declares GPUs 0 and 1; ``--gpus 0,2`` declares those indices; 0 or '' none."""
    value = value.strip()
    if value in ("", "0", "none"):
        return []
    if "," in value:
        try:
            indices = sorted({int(v) for v in value.split(",") if v.strip()})
        except ValueError:
            raise ValueError(f"--gpus takes a count or a list of indices, got {value!r}") from None
    else:
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"--gpus takes a count or a list of indices, got {value!r}") from None
        if count < 0:
            raise ValueError(f"--gpus must be >= 0, got {count}")
        indices = list(range(count))
    if any(i < 0 for i in indices):
        raise ValueError(f"--gpus indices must be >= 0, got {value!r}")
    return [Gpu(index=i, model="declared") for i in indices]


def local_node(cpus: int | None = None, gpus: str | None = None) -> Node:
    """This machine as a scheduler node, with the operator's overrides applied."""
    if cpus is not None and cpus < 1:
        raise ValueError(f"--cpus must be >= 1, got {cpus}")
    detected_gpus = detect_gpus() if gpus is None else parse_gpus(gpus)
    return Node(
        name=socket.gethostname() or "local",
        cpus=cpus or os.cpu_count() or 1,
        memory_bytes=psutil.virtual_memory().total,
        gpus=tuple(detected_gpus),
    )
