"""Step ``executor``: a 1-GPU job under the check's server sees its GPU, allocates 100 GiB, is
canceled, and NVML shows the GPU empty within 5 s of the job's exit.

The job is a plain script (no SDK): it prints what CUDA shows it and its PID, fills 100 GiB on
the GPU, prints ``allocated`` and sleeps without ever asking whether to stop, so the cancel
ends it the hard way (the server's ``--cancel-grace``, then SIGTERM). From the cancel on, the
step polls every 50 ms: the rank's process (gone or a zombie: exited), the job's state, and
NVML's processes and used memory on the job's GPU. "Empty" is no compute process and used memory
back within 1 GiB of what it was before the job started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import psutil

from _gpu.common import GIB, MIB, Results, attributed, gib, sizes, step_main
from _gpu.jobs import submit, tail, visible_id, wait_for_line

EMPTY_WITHIN = 5.0  # seconds from the rank's exit to an empty GPU
HELD = "GPU_CHECK_JOB "
ALLOCATED = "allocated"

JOB = f"""
import json, os, sys, time
import torch

size = int(sys.argv[1])
cuda = torch.cuda.is_available()
print({HELD!r} + json.dumps({{
    "pid": os.getpid(),
    "device_count": torch.cuda.device_count() if cuda else 0,
    "name": torch.cuda.get_device_name(0) if cuda else None,
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
}}), flush=True)
block = torch.empty(size, dtype=torch.uint8, device="cuda" if cuda else "cpu")
block.fill_(1)
if cuda:
    torch.cuda.synchronize()
print({ALLOCATED!r}, size >> 20, "MiB", flush=True)
while True:
    time.sleep(1)
"""


def fb_used(nvml: Any, gpu: int) -> float:
    """NVML's used memory of GPU ``gpu``, in bytes."""
    from trainhouse.core import metricnames as names

    values, _ = nvml.sample()
    return next((v * MIB for n, v, i in values if n == names.FB_USED and i == gpu), 0.0)


def exited(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def body(results: Results, args: argparse.Namespace) -> None:
    from trainhouse.client import Client
    from trainhouse.errors import ClientError
    from trainhouse.jobfs.nvml import Nvml

    size = sizes(args.smoke).executor_bytes
    nvml = Nvml.open()
    if nvml is None:
        results.missing("NVML", "no NVML: the GPU's processes and memory cannot be checked")
    workdir = Path("executor-job")
    workdir.mkdir()
    (workdir / "alloc.py").write_text(JOB)
    spec = {
        "name": "gpu-check-executor",
        "entrypoint": f"python alloc.py {size}",
        "resources": {"nodes": 1, "gpus_per_node": 1, "cpus_per_proc": 1},
    }
    # each GPU's used memory before the job (once the steps before have let go of it): what
    # "empty" comes back to
    baseline: dict[int, float] = {}
    if nvml is not None:
        indices = [g.index for g in nvml.gpus()]
        deadline = time.monotonic() + 10
        while any(nvml.holders(indices).values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        baseline = {i: fb_used(nvml, i) for i in indices}
    with Client(args.url) as client:
        job = submit(client, workdir, spec)
        job_id = int(job["id"])
        line = wait_for_line(client, job_id, HELD, timeout=args.budget / 2)
        allocated = wait_for_line(client, job_id, ALLOCATED, timeout=args.budget / 4)
        if line is None or allocated is None:
            results.add("FAIL", "job started", f"no {ALLOCATED!r} line:\n{tail(client, job_id)}")
            with contextlib.suppress(ClientError):  # it may have ended already
                client.cancel(job_id)
            return
        seen = json.loads(line[len(HELD) :])
        gpu, expected = visible_id(client, client.job(job_id))
        sees(results, seen, expected, nvml, gpu, args.smoke)
        job_memory(results, nvml, gpu, seen["pid"], size, baseline.get(gpu, 0.0))
        cancel(results, client, job_id, seen["pid"], nvml, gpu, baseline, args.budget / 4)
    if nvml is not None:
        nvml.close()


def sees(
    results: Results, seen: dict[str, Any], expected: str, nvml: Any, gpu: int, smoke: bool
) -> None:
    """The job's CUDA_VISIBLE_DEVICES names its GPU, and CUDA shows it that GPU alone."""
    results.check(
        "job's CUDA_VISIBLE_DEVICES",
        seen["visible"] == expected,
        f"{seen['visible']!r} (expected {expected!r}: the GPU it was given)",
    )
    if seen["device_count"] == 0 and smoke:
        results.skip("job sees its GPU", "no CUDA in the job (smoke run)")
        return
    want = next((g.model for g in nvml.gpus() if g.index == gpu), None) if nvml else None
    results.check(
        "job sees its GPU",
        seen["device_count"] == 1 and (want is None or seen["name"] == want),
        f"torch.cuda.device_count() = {seen['device_count']}, device 0 is {seen['name']!r}"
        f" (NVML's GPU {gpu}: {want!r})",
    )


def job_memory(results: Results, nvml: Any, gpu: int, pid: int, size: int, baseline: float) -> None:
    """NVML attributes the job's allocation to the job's process."""
    name = f"NVML sees the job's {gib(size)}"
    if nvml is None:
        results.skip(name, "no NVML")
        return
    _, by_pid = nvml.sample()
    used, how = attributed(by_pid, pid, gpu)
    grown = fb_used(nvml, gpu) - baseline
    results.check(
        name,
        used >= size,
        f"{gib(used)} on GPU {gpu} {how}; the GPU's used memory grew by {gib(grown)}",
        bytes=used,
    )


def cancel(
    results: Results,
    client: Any,
    job_id: int,
    pid: int,
    nvml: Any,
    gpu: int,
    baseline: dict[int, float],
    timeout: float,
) -> None:
    """Cancel the job, then time its rank's exit, its state and an empty GPU."""
    from trainhouse.lifecycle import TERMINAL

    start = time.monotonic()
    client.cancel(job_id)
    exit_at = ended_at = empty_at = None
    state = ""
    polled = 0.0
    deadline = start + timeout
    while time.monotonic() < deadline:
        now = time.monotonic()
        if exit_at is None and exited(pid):
            exit_at = now
        if nvml is not None and empty_at is None:
            holders = nvml.holders([gpu])[gpu]
            if not holders and fb_used(nvml, gpu) <= baseline.get(gpu, 0.0) + GIB:
                empty_at = now
        if ended_at is None and now - polled >= 0.25:
            polled = now
            state = client.job(job_id)["state"]
            if state in TERMINAL:
                ended_at = now
        if exit_at is not None and ended_at is not None and (nvml is None or empty_at):
            break
        time.sleep(0.05)
    if ended_at is None:
        ended = f"still {state} {timeout:.0f} s after the cancel"
    else:
        ended = f"{state} {ended_at - start:.2f} s after the cancel"
    results.check(
        "job canceled",
        state == "CANCELED" and exit_at is not None,
        f"{ended}; its rank's process exited {_after(exit_at, start)} after it (the server's "
        "cancel grace, then SIGTERM)",
        seconds=(ended_at or deadline) - start,
    )
    name = f"GPU empty within {EMPTY_WITHIN:.0f} s of the job's exit"
    if nvml is None:
        results.skip(name, "no NVML")
        return
    gone = exit_at or ended_at
    if gone is None or empty_at is None:
        results.add("FAIL", name, f"not empty {timeout:.0f} s after the cancel")
        return
    delay = max(0.0, empty_at - gone)
    results.check(
        name,
        delay <= EMPTY_WITHIN,
        f"no process on GPU {gpu} and used memory back to {gib(fb_used(nvml, gpu))} "
        f"{delay:.2f} s after the rank exited",
        seconds=delay,
    )


def _after(at: float | None, start: float) -> str:
    return "never" if at is None else f"{at - start:.2f} s"


def extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True)


if __name__ == "__main__":
    step_main("executor", body, extra)
