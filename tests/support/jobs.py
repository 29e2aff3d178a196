"""Job scripts and workdirs the integration tests submit, and how to find a rank's process.

Each script is a real training script using the SDK; :func:`write_job` lays one out as a workdir
with its spec, ready for ``trainhouse submit``.
"""

from __future__ import annotations

import contextlib
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.support.processes import marked_processes
from tests.support.servers import Server
from trainhouse.executors.node.torchrun import RANK_WRAPPER

RANK_WRAPPER_FILE = RANK_WRAPPER[-1]

LONG_SCRIPT = """
import time
import trainhouse

with trainhouse.init() as run:
    step = 0
    while not run.should_stop():
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        print(f"rank {run.rank} step {step}", flush=True)
        step += 1
        time.sleep(0.05)
    print(f"rank {run.rank} stopping at step {step} as asked", flush=True)
"""

# trains hparams.steps steps (default 40), a checkpoint every 5; yields when asked to stop
RESUMABLE = """
import time
import trainhouse

with trainhouse.init(hparams={"steps": 40}) as run:
    steps = int(run.hparams["steps"])
    run.set_total_steps(steps)
    state = run.checkpoint.load()
    start = state["step"] + 1 if state else 0
    print(f"rank {run.rank} attempt {run.attempt} starts at step {start}", flush=True)
    for step in range(start, steps):
        time.sleep(0.1)
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        stop = run.should_stop()
        if stop or step % 5 == 0:
            run.checkpoint.save({"step": step}, step=step)
        if stop:
            print(f"rank {run.rank} yields at step {step}", flush=True)
            break
"""

# an elastic job's script (unchanged under bare torchrun at any fixed size): DDP over gloo,
# ResumableSampler, every sample each rank draws gathered on rank 0 and kept in the checkpoint
# (saved when it stops, and every hparams.every steps if given), the learning rate rescaled with
# the world size; at the end rank 0 prints, per epoch, how many samples were seen and whether
# they were each sample exactly once. hparams.gate (optional) names a file that paces it: while
# the file holds a step, no later step starts (the job waits, still answering should_stop)
ELASTIC = """
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import trainhouse
from trainhouse.sdk.data import ResumableSampler

hparams = {"epochs": 2, "n": 240, "batch": 4, "sleep": 0.1, "every": 0, "gate": ""}
with trainhouse.init(hparams=hparams) as run:
    n, batch = int(run.hparams["n"]), int(run.hparams["batch"])
    epochs, pause = int(run.hparams["epochs"]), float(run.hparams["sleep"])
    every = int(run.hparams["every"])  # steps between checkpoints (0: only when it stops)
    gate = str(run.hparams["gate"])

    def held(next_step):
        # rank 0 reads the gate, every rank hears it: the same answer everywhere
        if not gate:
            return False
        word = [-1]
        if run.rank == 0:
            try:
                with open(gate) as fh:
                    word = [int(fh.read().strip() or -1)]
            except (OSError, ValueError):
                pass
        if run.world_size > 1:
            dist.broadcast_object_list(word, src=0)
        return 0 <= word[0] < next_step

    data = TensorDataset(torch.arange(n))
    sampler = ResumableSampler(data, seed=0, batch_size=batch)
    state = run.checkpoint.load()
    seen, step = {}, 0
    if state:
        sampler.load_state_dict(state["sampler"])
        seen, step = state["seen"], state["step"] + 1
    lr = 0.1 * run.world_size  # the linear scaling rule: a resized job rescales it
    print(
        f"rank {run.rank} attempt {run.attempt} world {run.world_size} resized {run.resized} "
        f"previous {run.previous_world_size} epoch {sampler.epoch} lr {lr} step {step}",
        flush=True,
    )
    run.set_total_steps(epochs * n // batch)
    loader = DataLoader(data, batch_size=batch, sampler=sampler)
    stopped = False
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for i, (x,) in enumerate(loader):
            parts = [None] * run.world_size
            if run.world_size > 1:
                dist.all_gather_object(parts, x.tolist())
            else:
                parts = [x.tolist()]
            if run.rank == 0:
                seen.setdefault(str(epoch), []).extend(v for part in parts for v in part)
            run.log({"world": run.world_size, "lr": lr}, step=step)
            time.sleep(pause)
            stop = run.should_stop()
            while not stop and held(step + 1):
                time.sleep(0.1)
                stop = run.should_stop()
            if stop or (every and (step + 1) % every == 0):
                position = sampler.state_dict(batches_done=i + 1)
                run.checkpoint.save({"sampler": position, "seen": seen, "step": step}, step=step)
            if stop:
                print(f"rank {run.rank} stops at step {step}: {run.stop_reason}", flush=True)
                stopped = True
                break
            step += 1
        if stopped:
            break
    if not stopped and run.rank == 0:
        for e in range(epochs):
            got = seen.get(str(e), [])
            print(f"epoch {e}: {len(got)} samples, each once: {sorted(got) == list(range(n))}")
"""

# RESUMABLE's loop, but its first attempt holds right after the checkpoint of step hparams.hold
# (a checkpoint every 5 steps): a test kills it there, between that save and its next flush
HOLDING = """
import time
import trainhouse

with trainhouse.init(hparams={"steps": 30, "hold": 10}) as run:
    steps, hold = int(run.hparams["steps"]), int(run.hparams["hold"])
    run.set_total_steps(steps)
    state = run.checkpoint.load()
    start = state["step"] + 1 if state else 0
    print(f"rank {run.rank} attempt {run.attempt} starts at step {start}", flush=True)
    for step in range(start, steps):
        time.sleep(0.1)
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        if step % 5 == 0:
            run.checkpoint.save({"step": step}, step=step)
        if step == hold and run.attempt == 1:
            print(f"holding after the checkpoint of step {step}", flush=True)
            time.sleep(300)
"""

# a script that never asks whether to stop: trainhouse must end it all the same
STUBBORN_SCRIPT = """
import time
import trainhouse

with trainhouse.init() as run:
    step = 0
    while True:
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        step += 1
        time.sleep(0.05)
"""


def write_job(tmp_path: Path, script: str, spec: str) -> Path:
    wd = tmp_path / "job"
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "train.py").write_text(textwrap.dedent(script))
    (wd / "job.yaml").write_text(textwrap.dedent(spec))
    return wd / "job.yaml"


def rank_process(job_id: int, rank: int) -> psutil.Process | None:
    """The training script's own process of one rank (not its wrapper, not torchrun)."""
    for proc in marked_processes():
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            cmd = proc.cmdline()
            if (
                env.get("TRAINHOUSE_JOB_ID") == str(job_id)
                and env.get("RANK") == str(rank)
                and "train.py" in " ".join(cmd)
                and RANK_WRAPPER_FILE not in cmd
            ):
                return proc
    return None


# randomness from every generator a script may use: dropout and data from torch's global RNG,
# numpy's and python's, each seeded per rank; nothing but the checkpoint carries their states
RANDOM_SCRIPT = """
import random
import time

import numpy as np
import torch
import trainhouse
from torch.nn.parallel import DistributedDataParallel as DDP

with trainhouse.init(hparams={"steps": 40, "seed": 0}) as run:
    steps = int(run.hparams["steps"])
    run.set_total_steps(steps)
    seed = int(run.hparams["seed"]) + run.rank
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
    )
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    state = run.checkpoint.load()
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
    for step in range(start, steps):
        x = torch.randn(16, 8) * float(np.random.uniform(0.5, 1.5)) + random.random()
        loss = torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss.item()}, step=step)
        if step % 5 == 4 or step == steps - 1:
            run.checkpoint.save(
                {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, step=step
            )
        time.sleep(0.05)
"""


# a search's trial: a synthetic learning curve whose floor is lowest at lr = 0.01, val_loss
# logged every step (hparams.delay apart), a checkpoint every 4 steps (not when stopped: a
# resumed attempt logs the steps after it again); says why it stopped
SEARCH_TRIAL = """
import math
import time
import trainhouse

with trainhouse.init(hparams={"lr": 0.01, "steps": 16, "delay": 0.1, "hold_at": -1}) as run:
    lr, steps = float(run.hparams["lr"]), int(run.hparams["steps"])
    hold_at = int(run.hparams["hold_at"])
    state = run.checkpoint.load()
    start = state["step"] + 1 if state else 0
    print(f"attempt {run.attempt} starts at step {start}", flush=True)
    floor = (math.log10(lr) + 2.0) ** 2
    for step in range(start, steps):
        time.sleep(float(run.hparams["delay"]))
        value = floor + 1.0 / (step + 1)
        run.log({"val_loss": value}, step=step)
        if step % 4 == 0:
            run.checkpoint.save({"step": step}, step=step, metrics={"val_loss": value})
        while step == hold_at and run.attempt == 1 and not run.should_stop():
            time.sleep(0.05)  # the first attempt ends only when it is told to stop
        if run.should_stop():
            print(f"stopped at step {step}: {run.stop_reason}", flush=True)
            break
"""


# a job of another tier that needs 2 CPUs for a few seconds (what makes an elastic job shrink)
HIGH_PRIORITY = "import time\nprint('high priority work', flush=True)\ntime.sleep(4)\n"


def elastic_job(
    root: Path, ranks: str = "2:4", *, epochs: int = 3, sleep: float = 0.15, name: str = "elastic"
) -> Path:
    """An ``ELASTIC`` job of ``low`` priority, ``procs_per_node: ranks``, resized no sooner than
    every 3 s."""
    return write_job(
        root / name,
        ELASTIC,
        f"""
        name: {name}
        entrypoint: python train.py
        priority: low
        resources: {{procs_per_node: "{ranks}"}}
        resize_interval: 3s
        preemption_grace: 60
        hparams: {{epochs: {epochs}, sleep: {sleep}}}
    """,
    )


def high_priority_job(root: Path) -> Path:
    """A ``HIGH_PRIORITY`` job of ``high`` priority on 2 ranks (2 CPUs)."""
    return write_job(
        root / "high",
        HIGH_PRIORITY,
        """
        name: urgent-eval
        entrypoint: python train.py
        priority: high
        resources: {procs_per_node: 2}
    """,
    )


@dataclass(frozen=True)
class ResizeRun:
    """An elastic job shrunk for a high-priority job and grown back, as the server saw it."""

    first: dict[str, Any]  # the elastic job at step 4 of its first attempt
    plan: dict[str, Any]  # the high-priority job's dry run then
    job: dict[str, Any]  # the elastic job, ended
    high: dict[str, Any]  # the high-priority job, ended


def shrink_and_grow_back(srv: Server, root: Path) -> ResizeRun:
    """An ``elastic_job`` (2:4 ranks, low) on ``srv`` (4 CPUs) until its step 4, then a
    ``high_priority_job`` (2 CPUs), both run to their end. The calls go over HTTP, without a
    CLI's start-up, so the high-priority job comes long before the elastic job could end."""
    with srv.client as c:
        job = c.submit(elastic_job(root, epochs=4, sleep=0.2))
        srv.wait_step(job["id"], 4)
        first = dict(c.job(job["id"]))
        plan = dict(c.dry_run(high_priority_job(root)))
        high = c.submit(high_priority_job(root))
    high_final = srv.wait(high["id"], {"COMPLETED", "FAILED"})
    final = srv.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=300)
    return ResizeRun(first, plan, final, high_final)
