"""Step ``inventory``: what NVML and torch see of the machine, and whether they agree.

NVML (``trainhouse.jobfs.nvml``, as the server reads it) finds the GPU with its name,
memory and UUID; torch's CUDA device 0 has the same UUID (torch prints it without NVML's
``GPU-`` prefix); and NVML attributes a 4 GiB tensor this process allocates to this process
(at least 4 GiB: the CUDA context comes on top).
"""

from __future__ import annotations

import argparse
import os
import platform
from typing import Any

import torch

from _gpu.common import Results, attributed, gib, sizes, step_main


def normalized_uuid(value: Any) -> str:
    """A GPU's UUID as lower-case hex digits and dashes, without NVML's ``GPU-`` prefix."""
    text = str(value).strip().lower()
    return text.removeprefix("gpu-")


def body(results: Results, args: argparse.Namespace) -> None:
    from trainhouse.jobfs.nvml import Nvml, detect_gpus

    cuda = torch.cuda.is_available()
    versions = [f"torch {torch.__version__}", f"CUDA {torch.version.cuda}"]
    if cuda:
        versions.append("NCCL " + ".".join(str(v) for v in torch.cuda.nccl.version()))
    versions.append(f"python {platform.python_version()}")
    nvml = Nvml.open()
    if nvml is not None:
        try:
            driver = nvml.nv.nvmlSystemGetDriverVersion()
        except nvml.nv.NVMLError as exc:
            driver = f"unknown ({exc})"
        versions.append(f"driver {driver.decode() if isinstance(driver, bytes) else driver}")
    results.info("versions", ", ".join(versions))

    gpus = detect_gpus()
    if not gpus:
        results.missing("NVML finds the GPU", "no NVML (no NVIDIA driver, or no GPU)")
    else:
        listed = "; ".join(f"{g.index}: {g.model}, {gib(g.memory_bytes)}, {g.uuid}" for g in gpus)
        results.check(
            "NVML finds the GPU",
            all(g.memory_bytes > 0 and g.uuid for g in gpus),
            f"{len(gpus)} GPU(s): {listed}",
            gpus=len(gpus),
        )
    if not cuda:
        results.missing("torch sees the GPU", "torch sees no CUDA device")
    else:
        props = torch.cuda.get_device_properties(0)
        results.check(
            "torch sees the GPU",
            torch.cuda.device_count() >= 1,
            f"{torch.cuda.device_count()} device(s); device 0: {props.name}, "
            f"{gib(props.total_memory)}, compute capability {props.major}.{props.minor}",
        )
    if gpus and cuda:
        mine = normalized_uuid(torch.cuda.get_device_properties(0).uuid)
        same = [g for g in gpus if normalized_uuid(g.uuid) == mine]
        results.check(
            "NVML UUID = torch UUID",
            len(same) == 1,
            f"torch's device 0 is {mine}; NVML: "
            + (f"GPU {same[0].index}, {same[0].uuid}" if same else "no GPU with that UUID"),
        )
    else:
        results.missing("NVML UUID = torch UUID", "needs both NVML and CUDA")
    process_memory(results, args, nvml, cuda)
    if nvml is not None:
        nvml.close()


def process_memory(results: Results, args: argparse.Namespace, nvml: Any, cuda: bool) -> None:
    """Allocate the inventory's tensor (4 GiB) and find it in NVML's per-process accounting."""
    size = sizes(args.smoke).inventory_bytes
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    block = torch.empty(size, dtype=torch.uint8, device=device)
    block.fill_(1)
    if cuda:
        torch.cuda.synchronize()
    name = f"NVML attributes a {gib(size)} tensor to this process"
    if nvml is None or not cuda:
        results.missing(name, "no NVML or no CUDA")
        return
    gpu = torch_gpu_index(nvml)
    _, by_pid = nvml.sample()
    used, how = attributed(by_pid, os.getpid(), gpu)
    results.check(
        name,
        used >= size,
        f"{gib(used)} on GPU {gpu} {how} (>= {gib(size)} expected: the tensor plus the CUDA "
        "context)",
        bytes=used,
    )
    del block


def torch_gpu_index(nvml: Any) -> int:
    """NVML's index of torch's device 0 (by UUID; 0 where none matches)."""
    mine = normalized_uuid(torch.cuda.get_device_properties(0).uuid)
    for g in nvml.gpus():
        if normalized_uuid(g.uuid) == mine:
            return int(g.index)
    return 0


if __name__ == "__main__":
    step_main("inventory", body)
