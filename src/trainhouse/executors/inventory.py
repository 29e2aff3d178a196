"""What this machine offers: CPU cores, memory and GPUs (NVML's, when present), or what the
operator declares with ``--cpus`` and ``--gpus``.

A ``CUDA_VISIBLE_DEVICES`` the server inherits is honoured: only the GPUs it names are offered
(by NVML index, read in PCI bus order as ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` does, or by UUID), and
a declared GPU ``i`` is the mask's ``i``-th entry."""

from __future__ import annotations

import os
import socket

import psutil

from trainhouse.core.cluster import Gpu, Node
from trainhouse.jobfs.nvml import detect_gpus, parse_mask


def server_mask() -> list[str] | None:
    """The entries of the ``CUDA_VISIBLE_DEVICES`` this server was started with (None: unset)."""
    return parse_mask(os.environ.get("CUDA_VISIBLE_DEVICES"))


def parse_gpus(value: str, mask: list[str] | None = None) -> list[Gpu]:
    """``--gpus 2`` declares GPUs 0 and 1; ``--gpus 0,2`` declares those indices; 0 or '' none.
    Under a ``mask`` (the server's ``CUDA_VISIBLE_DEVICES`` entries) GPU ``i`` is entry ``i``."""
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
    if mask is None:
        return [Gpu(index=i, model="declared") for i in indices]
    if indices and max(indices) >= len(mask):
        raise ValueError(
            f"--gpus {value} declares GPU {max(indices)}, but the server's CUDA_VISIBLE_DEVICES "
            f"names {len(mask)} device(s): {','.join(mask) or '(none)'}"
        )
    return [Gpu(index=i, model="declared", uuid=mask[i]) for i in indices]


def local_node(cpus: int | None = None, gpus: str | None = None) -> Node:
    """This machine as a scheduler node, with the operator's overrides applied."""
    if cpus is not None and cpus < 1:
        raise ValueError(f"--cpus must be >= 1, got {cpus}")
    mask = server_mask()
    detected_gpus = detect_gpus(mask) if gpus is None else parse_gpus(gpus, mask)
    return Node(
        name=socket.gethostname() or "local",
        cpus=cpus or os.cpu_count() or 1,
        memory_bytes=psutil.virtual_memory().total,
        gpus=tuple(detected_gpus),
    )
