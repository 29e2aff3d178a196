"""What the steps of ``bench/gpu_check.py`` share: the items they report, the sizes they run
at (full, or tiny for ``--smoke``), and NVML's view of a process.

A step runs as ``python -m _gpu.STEP --result FILE [--smoke] ...`` and appends each item to
FILE (JSON lines) as soon as it is decided, so a step killed at its timeout still reports
what it got to. An item is PASS or FAIL (a check), SKIP (a check that cannot run here, with
why) or INFO (a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _gpu.gpt import GPTConfig

GIB = 1 << 30
MIB = 1 << 20


@dataclass
class Item:
    step: str
    name: str
    status: str  # PASS, FAIL, SKIP or INFO
    detail: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


class Results:
    """A step's items, appended to a JSON-lines file as they are decided."""

    def __init__(self, path: Path, step: str, smoke: bool) -> None:
        self.path = path
        self.step = step
        self.smoke = smoke

    def add(self, status: str, name: str, detail: str = "", **numbers: float) -> Item:
        item = Item(self.step, name, status, detail, {k: float(v) for k, v in numbers.items()})
        with self.path.open("a") as fh:
            fh.write(json.dumps(asdict(item)) + "\n")
        print(f"{status:<5} {name}: {detail}", flush=True)  # into the step's own log
        return item

    def check(self, name: str, ok: bool, detail: str = "", **numbers: float) -> bool:
        self.add("PASS" if ok else "FAIL", name, detail, **numbers)
        return ok

    def info(self, name: str, detail: str, **numbers: float) -> None:
        self.add("INFO", name, detail, **numbers)

    def skip(self, name: str, why: str) -> None:
        self.add("SKIP", name, f"skipped: {why}")

    def missing(self, name: str, what: str) -> None:
        """``what`` is not there: expected in a smoke run on the CPU (SKIP), a failure on a
        GPU machine (FAIL)."""
        if self.smoke:
            self.skip(name, what)
        else:
            self.add("FAIL", name, what)


def read_items(path: Path) -> list[Item]:
    if not path.exists():
        return []
    items = []
    for line in path.read_text().splitlines():
        if line.strip():
            items.append(Item(**json.loads(line)))
    return items


def step_main(
    step: str,
    body: Callable[[Results, argparse.Namespace], None],
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """A step's entry point: parse ``--result``, ``--smoke``, ``--budget`` (seconds the step
    has) and the step's own options, run ``body``, and record a crash as a FAIL item."""
    parser = argparse.ArgumentParser(description=f"gpu_check step {step}")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--budget", type=float, default=600.0)
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    results = Results(args.result, step, args.smoke)
    try:
        body(results, args)
    except BaseException as exc:
        tail = "".join(traceback.format_exception(exc))[-1500:]
        results.add("FAIL", "ran to the end", f"{type(exc).__name__}: {exc}\n{tail}")
        sys.exit(1)


# -- sizes -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    inventory_bytes: int  # the tensor NVML must attribute to the inventory's process
    big: GPTConfig  # the SDK step's model (~1B parameters, bf16)
    big_batch: int
    sharded: GPTConfig  # the FSDP step's model
    sharded_batch: int
    executor_bytes: int  # what the canceled job allocates
    throughput: GPTConfig
    throughput_batch: int
    throughput_seconds: float  # timed training per side
    warmup: int
    calibrate: int
    log_every: int
    cpus_per_proc: int  # the throughput job's (and so OMP_NUM_THREADS on both sides)


FULL = Sizes(
    inventory_bytes=4 * GIB,
    big=GPTConfig(vocab=32768, seq=256, layers=18, d_model=2048, heads=16),
    big_batch=2,
    sharded=GPTConfig(vocab=16384, seq=512, layers=4, d_model=1024, heads=16),
    sharded_batch=4,
    executor_bytes=100 * GIB,
    throughput=GPTConfig(vocab=50304, seq=1024, layers=6, d_model=768, heads=12),
    throughput_batch=16,
    throughput_seconds=30.0,
    warmup=10,
    calibrate=10,
    log_every=10,
    cpus_per_proc=4,
)

SMOKE = Sizes(
    inventory_bytes=16 * MIB,
    big=GPTConfig(vocab=256, seq=32, layers=2, d_model=64, heads=4),
    big_batch=2,
    sharded=GPTConfig(vocab=256, seq=32, layers=2, d_model=64, heads=4),
    sharded_batch=2,
    executor_bytes=16 * MIB,
    throughput=GPTConfig(vocab=256, seq=64, layers=2, d_model=64, heads=4),
    throughput_batch=4,
    throughput_seconds=2.0,
    warmup=2,
    calibrate=3,
    log_every=5,
    cpus_per_proc=1,
)


def sizes(smoke: bool) -> Sizes:
    return SMOKE if smoke else FULL


def gib(n: float) -> str:
    """A number of bytes in GiB, or in MiB below 1 GiB (smoke runs)."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.2f} MiB"


def millions(n: float) -> str:
    """A parameter count: 1.04 B, 83.2 M."""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.3g} M"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without trainhouse's variables (but where clients keep their
    tokens) or torchrun's: a run started with it is standalone. Plus ``extra``."""
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and (not k.startswith("TRAINHOUSE_") or k == "TRAINHOUSE_CONFIG_DIR")
    }
    env.update(extra)
    return env


# -- NVML --------------------------------------------------------------------------------------
def attributed(by_pid: dict[int, dict[int, int]], pid: int, gpu: int) -> tuple[int, str]:
    """The bytes NVML attributes to process ``pid`` on GPU ``gpu`` (from ``Nvml.sample()``'s
    ``by_pid``), and how it was matched: under any of the process's PIDs (the server's own
    matching), or else as the GPU's only process whose PID is not visible here (NVML gives the
    host's PIDs; a container without the host's PID namespace sees none of them)."""
    import psutil

    from trainhouse.monitoring.sampler import nspids

    mine = sum(by_pid.get(p, {}).get(gpu, 0) for p in nspids(pid))
    if mine:
        return mine, f"under PID {pid}"
    foreign = [(p, gpus[gpu]) for p, gpus in by_pid.items() if gpu in gpus]
    foreign = [(p, used) for p, used in foreign if not psutil.pid_exists(p)]
    if len(foreign) == 1:
        other, used = foreign[0]
        return used, (
            f"under NVML's PID {other}, which is not visible here (a PID namespace of its own: "
            "a container without the host's); the GPU's only such process"
        )
    seen = {p: gpus.get(gpu, 0) for p, gpus in by_pid.items()}
    return 0, f"no process matched PID {pid}; NVML lists {seen or 'none'}"
