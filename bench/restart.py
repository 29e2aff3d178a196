"""How long from a killed rank to the next training step, compared with a cold start?

A real server (``trainhouse.client.serverprocess.ServerProcess``: a temporary home, a free port,
``--cpus 2``, no GPUs) runs a small job of 2 DDP ranks over gloo (``OMP_NUM_THREADS=1``): a
linear model trained for a step about every 0.1 s, logging ``loss`` and ``attempt`` (its
``run.attempt``) at every step, checkpointing model and optimizer every ``--every`` steps
(5), resuming from ``run.checkpoint.load()``, with ``max_restarts: 3`` in its spec. The script
and its ``trainhouse.yaml`` are written to a temporary workdir and submitted with
``trainhouse.client.Client.submit``.

Cold start
    ``time.time()`` just before ``submit`` (which packs and uploads the workdir) to the
    ``wall_time`` of the job's first metric point (rank 0 logs it right after its first step).

Restart
    Once the job has trained ``--warm-steps`` steps (15) past its start, rank 1's user process
    (found with psutil: ``TRAINHOUSE_RUN_MARKER`` and ``RANK=1`` in its environment, its job
    directory under this benchmark's home, ``train.py`` in its command line, not the
    ``trainhouse.executors.node.rank`` wrapper nor torchrun) is sent SIGKILL and the time is taken.
    The server sees the attempt fail, requeues the job and starts the next attempt, which loads
    the latest checkpoint. The restart latency is the ``wall_time`` of the first point of the
    ``attempt`` metric whose value is the new attempt's number, minus the kill time. Every
    job is killed ``--kills`` times (1), each time once the new attempt has trained
    ``--warm-steps`` steps, and then canceled; the next job is submitted only once it has ended,
    so no cold start waits for resources.

    ``--jobs`` jobs (3; 1 with ``--quick``) run one after the other on the same server. The
    medians of the cold starts and of the restarts are compared: restart / cold, printed with
    where the time went (from the job's attempt history: kill -> the server recorded the failed
    attempt's end -> the next attempt started -> its first step; submit -> the first attempt
    started -> its first step). No target is set; the ratio is what is measured.

The server is stopped (SIGTERM, which stops its jobs) at the end, also after an error or
Ctrl-C, and any process still carrying a run marker under the temporary home is killed and
reported. It is a benchmark, not a test: it exits 0 whatever the numbers.

    python bench/restart.py [--quick] [--jobs 3] [--kills 1] [--every 5] [--warm-steps 15]
                            [--quiet-wait 30] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _machine import BUSY_PERCENT, log, machine_busy, wait_quiet

MARKER_ENV = "TRAINHOUSE_RUN_MARKER"
END_STATES = ("COMPLETED", "FAILED", "CANCELED")
POLL = 0.25  # seconds between the harness's polls of the server

SCRIPT = """
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import trainhouse

with trainhouse.init(hparams={"steps": 3000, "every": 5, "sleep": 0.1}) as run:
    steps, every = int(run.hparams["steps"]), int(run.hparams["every"])
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 1)
    ddp = DDP(model) if run.world_size > 1 else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    start = 0
    state = run.checkpoint.load()
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
    print(f"rank {run.rank} attempt {run.attempt} starts at step {start}", flush=True)
    for step in range(start, steps):
        x = torch.randn(64, 32)
        loss = torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss.item(), "attempt": run.attempt}, step=step)
        stop = run.should_stop()
        if stop or step % every == 0:
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
            run.checkpoint.save(state, step=step)
        if stop:
            break
        time.sleep(float(run.hparams["sleep"]))
"""

SPEC = """
name: restart-bench
entrypoint: python train.py
workdir: .
resources: {nodes: 1, procs_per_node: 2, gpus_per_node: 0, cpus_per_proc: 1}
max_restarts: 3
hparams: {steps: 3000, every: 5, sleep: 0.1}
env: {OMP_NUM_THREADS: "1"}
"""


@dataclass
class Restart:
    attempt: int  # the attempt that started after the kill
    kill_at: float
    first_step_at: float
    failed_ended_at: float | None  # the killed attempt's end, as the server recorded it
    started_at: float | None  # the new attempt's start
    reason: str | None = None  # why the killed attempt ended, as the server recorded it

    @property
    def latency(self) -> float:
        return self.first_step_at - self.kill_at


@dataclass
class JobRun:
    job_id: int
    submit_at: float
    first_step_at: float
    started_at: float | None  # attempt 1's start
    restarts: list[Restart] = field(default_factory=list)

    @property
    def cold(self) -> float:
        return self.first_step_at - self.submit_at


# -- processes ---------------------------------------------------------------------------------
def marked(home: Path) -> list[psutil.Process]:
    """Live processes a job of the server in ``home`` started (they carry a run marker)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            env = proc.environ()
            if MARKER_ENV in env and env.get("TRAINHOUSE_LOG_DIR", "").startswith(str(home)):
                found.append(proc)
    return found


def rank_process(home: Path, job_id: int, rank: int) -> psutil.Process | None:
    """The user's ``python train.py`` of ``rank`` (not the rank wrapper, not torchrun)."""
    for proc in marked(home):
        with contextlib.suppress(psutil.Error, OSError):
            env = proc.environ()
            cmd = proc.cmdline()
            if (
                env.get("RANK") == str(rank)
                and env.get("TRAINHOUSE_JOB_ID") == str(job_id)
                and any(Path(arg).name == "train.py" for arg in cmd)
                and "-m" not in cmd
                and not any(
                    "trainhouse.executors" in arg or "torch.distributed" in arg for arg in cmd
                )
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                return proc
    return None


def kill_leftovers(home: Path) -> list[str]:
    """SIGKILL whatever still carries a run marker under ``home``; what was found."""
    left = marked(home)
    found = []
    for proc in left:
        with contextlib.suppress(psutil.Error):
            found.append(f"{proc.pid}: {' '.join(proc.cmdline())[:160]}")
            proc.kill()
    psutil.wait_procs(left, timeout=10)
    return found


# -- talking to the server ---------------------------------------------------------------------
def attempt_points(client: Any, job_id: int, attempt: int, after: float) -> list[float]:
    """``wall_time`` of rank 0's ``attempt`` points with value ``attempt`` after ``after``."""
    series = client.metrics(job_id, name="attempt")["series"]
    return [
        float(p[2])
        for s in series
        if s["rank"] is None
        for p in s["points"]
        if p[1] is not None and int(p[1]) == attempt and float(p[2]) > after
    ]


def wait_for(what: str, timeout: float, check: Any) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL)


class Driver:
    def __init__(self, client: Any, home: Path, spec: Path, args: argparse.Namespace) -> None:
        self.client = client
        self.home = home
        self.spec = spec
        self.args = args

    def job(self, job_id: int) -> dict[str, Any]:
        job: dict[str, Any] = self.client.job(job_id)
        if job["state"] in END_STATES:
            text, _, _ = self.client.logs(job_id, rank=0, tail=30)
            raise RuntimeError(f"job {job_id} ended {job['state']}: {job['reason']}\n{text}")
        return job

    def attempt_times(self, job_id: int, number: int) -> tuple[float | None, float | None]:
        """(started_at, ended_at) of attempt ``number``, as the server recorded them."""
        att = self.attempt(job_id, number)
        return att.get("started_at"), att.get("ended_at")

    def attempt(self, job_id: int, number: int) -> dict[str, Any]:
        for att in self.client.job(job_id)["attempt_history"]:
            if int(att["number"]) == number:
                return dict(att)
        return {}

    def attempt_points(self, job_id: int, attempt: int, after: float) -> list[float]:
        """Wall times of attempt ``attempt``'s steps logged after ``after`` (raises if it ended)."""
        self.job(job_id)
        return attempt_points(self.client, job_id, attempt, after)

    def wait_steps(self, job_id: int, attempt: int, after: float, count: int) -> float:
        """Wait until ``attempt`` logged ``count`` steps after ``after``; the first one's time."""

        def check() -> float | None:
            times = self.attempt_points(job_id, attempt, after)
            return min(times) if len(times) >= count else None

        try:
            first: float = wait_for(
                f"attempt {attempt} of job {job_id} to train", self.args.timeout, check
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.describe(job_id)}") from None
        return first

    def describe(self, job_id: int) -> str:
        """The job's state, attempts, last events and log tails (for an error message)."""
        try:
            job = self.client.job(job_id)
            lines = [
                f"job {job_id}: {job['state']}, attempts {job['attempts']}, "
                f"last_step {job.get('last_step')}, reason {job.get('reason')}"
            ]
            for att in job["attempt_history"]:
                lines.append(
                    f"  attempt {att['number']}: {att.get('result')} ({att.get('reason')})"
                )
            for ev in job["events"][-8:]:
                lines.append(f"  event {ev['from_state']} -> {ev['to_state']}: {ev['reason']}")
            for rank in (0, 1):
                text, _, _ = self.client.logs(job_id, rank=rank, tail=15)
                lines.append(f"  --- rank {rank} log tail ---\n{text}")
            return "\n".join(lines)
        except Exception as exc:
            return f"(cannot describe job {job_id}: {exc!r})"

    def one_job(self, n: int) -> JobRun:
        a = self.args
        submit_at = time.time()
        job_id = int(self.client.submit(self.spec, overrides=[f"hparams.every={a.every}"])["id"])
        try:
            first = self.wait_steps(job_id, 1, 0.0, 1)
            started, _ = self.attempt_times(job_id, 1)
            run = JobRun(job_id, submit_at, first, started)
            log(f"[job {n}] id {job_id}: cold start {run.cold:.2f} s")
            self.wait_steps(job_id, 1, 0.0, a.warm_steps)
            for attempt in range(2, a.kills + 2):
                proc = wait_for(
                    f"rank 1 of job {job_id}", 30, lambda: rank_process(self.home, job_id, 1)
                )
                kill_at = time.time()
                proc.send_signal(signal.SIGKILL)
                # the first step the new attempt logged; waiting for --warm-steps of them also
                # lets it run a while before the next kill
                first_new = self.wait_steps(job_id, attempt, kill_at, a.warm_steps)
                old = self.attempt(job_id, attempt - 1)
                started, _ = self.attempt_times(job_id, attempt)
                reason = old.get("reason")
                r = Restart(attempt, kill_at, first_new, old.get("ended_at"), started, reason)
                run.restarts.append(r)
                log(
                    f"[job {n}] killed rank 1 (pid {proc.pid}); attempt {attempt} stepped "
                    f"{r.latency:.2f} s later; attempt {attempt - 1} ended: {reason}"
                )
        finally:
            self.cancel(job_id)
        return run

    def cancel(self, job_id: int) -> None:
        with contextlib.suppress(Exception):
            self.client.cancel(job_id)
        with contextlib.suppress(Exception):
            self.client.wait(job_id, timeout=120, poll=POLL)
        # the resources are free once its processes are gone
        with contextlib.suppress(TimeoutError):
            wait_for(
                f"job {job_id}'s processes to end", 30, lambda: None if marked(self.home) else 1
            )


# -- report ------------------------------------------------------------------------------------
def summarize(runs: list[JobRun], busy: float, args: argparse.Namespace) -> dict[str, Any]:
    colds = [r.cold for r in runs]
    restarts = [x for r in runs for x in r.restarts]
    lat = [x.latency for x in restarts]

    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    cold_launch = med([r.started_at - r.submit_at if r.started_at else None for r in runs])
    cold_step = med([r.first_step_at - r.started_at if r.started_at else None for r in runs])
    noticed = med([x.failed_ended_at - x.kill_at if x.failed_ended_at else None for x in restarts])
    relaunch = med(
        [
            x.started_at - x.failed_ended_at if x.started_at and x.failed_ended_at else None
            for x in restarts
        ]
    )
    new_step = med([x.first_step_at - x.started_at if x.started_at else None for x in restarts])
    cold, restart = statistics.median(colds), statistics.median(lat)
    return {
        "jobs": len(runs),
        "kills_per_job": args.kills,
        "every": args.every,
        "cold_s": colds,
        "restart_s": lat,
        "cold_median": cold,
        "restart_median": restart,
        "ratio": restart / cold,
        "cold_breakdown": {"submit_to_started": cold_launch, "started_to_first_step": cold_step},
        "restart_breakdown": {
            "kill_to_attempt_ended": noticed,
            "ended_to_next_started": relaunch,
            "started_to_first_step": new_step,
        },
        "busy_percent": busy,
        "runs": [asdict(r) for r in runs],
    }


def seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"


def print_report(s: dict[str, Any]) -> None:
    cb, rb = s["cold_breakdown"], s["restart_breakdown"]
    print(
        f"{s['jobs']} job(s) of 2 DDP ranks (gloo), a step every ~0.1 s, a checkpoint every "
        f"{s['every']} steps; rank 1 SIGKILLed {s['kills_per_job']} time(s) per job"
    )
    print()
    print(
        f"cold start, submit -> first step      median {s['cold_median']:6.2f} s   "
        f"runs: {' '.join(f'{v:.2f}' for v in s['cold_s'])}"
    )
    print(f"    submit -> attempt 1 started        {seconds(cb['submit_to_started'])}")
    print(f"    started -> first step              {seconds(cb['started_to_first_step'])}")
    print(
        f"restart, kill -> first new step       median {s['restart_median']:6.2f} s   "
        f"runs: {' '.join(f'{v:.2f}' for v in s['restart_s'])}"
    )
    print(f"    kill -> failed attempt ended       {seconds(rb['kill_to_attempt_ended'])}")
    print(f"    ended -> next attempt started      {seconds(rb['ended_to_next_started'])}")
    print(f"    started -> first step              {seconds(rb['started_to_first_step'])}")
    print("(the breakdowns are medians of the server's attempt start/end times)")
    print()
    if s["busy_percent"] > BUSY_PERCENT:
        print(
            f"warning: the CPUs were {s['busy_percent']:.0f}% busy before a job or after the "
            "last; "
            "the numbers are unreliable, rerun on a quieter machine"
        )
    print(f"ratio restart/cold = {s['ratio']:.3f}")


# -- main --------------------------------------------------------------------------------------
def write_job(workdir: Path) -> Path:
    workdir.mkdir(parents=True)
    (workdir / "train.py").write_text(textwrap.dedent(SCRIPT).lstrip())
    spec = workdir / "trainhouse.yaml"
    spec.write_text(textwrap.dedent(SPEC).lstrip())
    return spec


def bench(args: argparse.Namespace) -> dict[str, Any]:
    from trainhouse.client import Client
    from trainhouse.client.serverprocess import ServerProcess, free_port

    busy = wait_quiet(args.quiet_wait)
    tmp = Path(tempfile.mkdtemp(prefix="trainhouse-bench-restart-"))
    home = tmp / "home"
    spec = write_job(tmp / "job")
    saved_env = {k: v for k, v in os.environ.items() if k.startswith("TRAINHOUSE_")}
    for key in saved_env:  # the server gets --home; a job's ranks get their own variables
        del os.environ[key]
    server = ServerProcess(home, free_port(), "--cpus", "2", "--gpus", "0")
    runs: list[JobRun] = []
    try:
        log(f"starting a server in {home} (CPU in use before: {busy:.0f}%) ...")
        server.start()
        with Client(server.url) as client:
            driver = Driver(client, home, spec, args)
            for n in range(1, args.jobs + 1):
                if n > 1:
                    busy = max(busy, wait_quiet(min(args.quiet_wait, 15.0)))
                runs.append(driver.one_job(n))
        busy = max(busy, machine_busy())
    finally:
        try:
            server.stop()
        finally:
            left = kill_leftovers(home)
            if left:
                log("warning: processes were left after the server stopped (killed now):")
                for line in left:
                    log(f"    {line}")
            os.environ.update(saved_env)
            shutil.rmtree(tmp, ignore_errors=True)
    return summarize(runs, busy, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time from a SIGKILLed rank to the next training step vs a cold start."
    )
    parser.add_argument("--quick", action="store_true", help="1 job, 1 kill, 10 warm steps")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="1 job, 1 kill, 4 warm steps, no quiet wait (the suite's check)",
    )
    parser.add_argument("--jobs", type=int, help="jobs run one after the other (3)")
    parser.add_argument("--kills", type=int, default=1, help="kills of rank 1 per job (1)")
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps (5)")
    parser.add_argument("--warm-steps", type=int, help="steps trained before each kill (15)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per wait (180)")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        help="seconds to wait first for other processes to leave the CPUs (30; 5 with --quick)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.quick = True
        args.warm_steps = args.warm_steps or 4
        args.every = min(args.every, 2)
        args.quiet_wait = 0.0 if args.quiet_wait is None else args.quiet_wait
    args.jobs = args.jobs or (1 if args.quick else 3)
    args.warm_steps = args.warm_steps or (10 if args.quick else 15)
    if args.quiet_wait is None:
        args.quiet_wait = 5.0 if args.quick else 30.0
    if args.jobs < 1 or args.kills < 1 or args.every < 1 or args.warm_steps < 1:
        parser.error("--jobs, --kills, --every and --warm-steps must be >= 1")
    summary = bench(args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_report(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
