"""What this machine offers: CPU cores, memory and GPUs (NVML's, when present), or what the
operator declares with ``--cpus`` and ``--gpus``."""

from __future__ import annotations

import os
import socket

import psutil

from trainhouse.cluster import Gpu, Node
from trainhouse.monitoring.nvml import detect_gpus


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
