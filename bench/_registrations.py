"""bench/overhead.py's second part: the server's CPU per checkpoint a job registers.

A job that checkpoints steals from every job on its node whatever the server spends on each of
its checkpoints: the metrics flushed before it, the registration (the file checked in storage,
the record written) and retention (what the policy drops deleted, after the checkpoint a
restart would load is checked). Measured apart from everything else the server does for a
job, as a difference between two jobs run one after the other on one fresh server:

    control      ``--registrations`` steps, each: ``run.log`` of a loss, a pause (``--pause``)
    checkpoints  the same steps, each also ``run.checkpoint.save`` of a state of 100,000
                 float32 (400 KB, the order of the digits example's model and optimizer) with a
                 validation loss, under the example's retention (keep the last 2 and the best 1)

Both are real jobs of the local executor (the file the script is, uploaded with the spec); the
server's own CPU time (``psutil``, its threads, not its jobs) is read before the submit and
after the job ended and the server's retention finished. The server's CPU per checkpoint is
(checkpoints - control) / registrations; the goal is <= 2 ms.

The job that checkpoints runs longer than the control (each save takes a few milliseconds),
and part of what a job costs the server is per second of its life, not per checkpoint: its
heartbeats, its log capture, the scheduler's and the monitor's ticks. The report also gives
the figure with the control's CPU scaled to the checkpointing job's duration (its ranks'
``started_at`` to ``ended_at``): what the checkpoints themselves cost.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

GOAL_MS = 2.0

JOB = """\
import sys
import time

import torch

import trainhouse

steps, pause, save = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "save"
run = trainhouse.init()
state = {"weights": torch.zeros(100_000)}
for step in range(steps):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    if save:
        run.checkpoint.save(state, step=step, metrics={"val_loss": 1.0 / (step + 1)}, rng=False)
    time.sleep(pause)
run.finish()
"""

SPEC = """\
name: {name}
entrypoint: python job.py {steps} {pause} {mode}
workdir: .
resources: {{procs_per_node: 1, cpus_per_proc: 1}}
env: {{OMP_NUM_THREADS: "1"}}
checkpoints: {{keep_last: 2, keep_best: 1, metric: val_loss, mode: min}}
"""


@dataclass
class Registrations:
    steps: int
    control_cpu_s: float
    checkpoints_cpu_s: float
    kept: int  # what retention left
    control_s: float = 0.0  # each job's duration, started_at to ended_at
    checkpoints_s: float = 0.0

    @property
    def ms_per_checkpoint(self) -> float:
        return 1000 * (self.checkpoints_cpu_s - self.control_cpu_s) / self.steps

    @property
    def ms_per_checkpoint_same_duration(self) -> float:
        """Against the control's CPU scaled to the checkpointing job's duration."""
        scale = self.checkpoints_s / self.control_s if self.control_s > 0 else 1.0
        return 1000 * (self.checkpoints_cpu_s - self.control_cpu_s * scale) / self.steps


def _cpu(pid: int) -> float:
    """User + system CPU seconds of the server process itself (its threads, not its jobs)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _duration(job: dict[str, Any]) -> float:
    """Seconds from the job's start to its end, as the server recorded them (Unix times)."""
    return float(job["ended_at"]) - float(job["started_at"])


def _run(
    client: Any, server_pid: int, workdir: Path, mode: str, steps: int, pause: float
) -> tuple[float, int, float]:
    spec = workdir / f"{mode}.yaml"
    spec.write_text(SPEC.format(name=f"registrations-{mode}", steps=steps, pause=pause, mode=mode))
    before = _cpu(server_pid)
    job = client.submit(spec)
    final = client.wait(job["id"], timeout=600, poll=1.0)
    if final["state"] != "COMPLETED":
        text, _, _ = client.logs(job["id"], rank=0, tail=40)
        raise RuntimeError(f"the {mode} job ended {final['state']}:\n{text}")
    time.sleep(1.0)  # retention runs in the background after the last registration
    return _cpu(server_pid) - before, job["id"], _duration(final)


def measure(served: Callable[[int], Any], steps: int, pause: float) -> Registrations:
    """Both jobs on one fresh server (``served``: bench/overhead.py's), control first."""
    with tempfile.TemporaryDirectory(prefix="trainhouse-bench-registrations-") as tmp:
        workdir = Path(tmp)
        (workdir / "job.py").write_text(JOB)
        with served(2) as (client, server):
            control, _, control_s = _run(client, server.pid, workdir, "log", steps, pause)
            saving, job_id, saving_s = _run(client, server.pid, workdir, "save", steps, pause)
            kept = len(client.checkpoints(job_id)["checkpoints"])
    return Registrations(steps, control, saving, kept, control_s, saving_s)


def report(r: Registrations) -> str:
    verdict = "PASS" if r.ms_per_checkpoint <= GOAL_MS else "ABOVE GOAL"
    return (
        f"the server's CPU per checkpoint: {r.ms_per_checkpoint:.2f} ms "
        f"({r.steps} checkpoints {r.checkpoints_cpu_s:.2f} s, the same job without them "
        f"{r.control_cpu_s:.2f} s; {r.kept} kept) (goal <= {GOAL_MS:g} ms): {verdict}\n"
        f"  against the control scaled to the same duration ({r.checkpoints_s:.1f} s against "
        f"{r.control_s:.1f} s): {r.ms_per_checkpoint_same_duration:.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    """Only this measurement, without overhead.py's ABBA runs before it."""
    import argparse

    from overhead import served  # bench/ is on the path when this file is run

    parser = argparse.ArgumentParser(description="The server's CPU per checkpoint registration.")
    parser.add_argument("--registrations", type=int, default=200, help="checkpoints (200)")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between them (0.05)")
    parser.add_argument("--repeats", type=int, default=1, help="measurements, each a server (1)")
    args = parser.parse_args(argv)
    for _ in range(args.repeats):
        print(report(measure(served, args.registrations, args.pause)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
