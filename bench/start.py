"""How long does trainhouse take to start (and end) a short job? Bare torchrun vs trainhouse.

The job
    The digits example (``examples/digits/train.py``, 2 ranks, gloo on the CPU) for
    ``--epochs`` epochs (3: about 11 s under bare torchrun on a 2-CPU machine), run through
    ``bench/_start_job.py``, which calls the example's ``main()`` unchanged and notes when its
    interpreter started, its imports ended, ``trainhouse.init()`` ran and its first training step
    ended, with the start times of its process and every ancestor (``/proc``).

The two sides, in the same run, alternating ABBA
    bare        ``python -m torch.distributed.run --standalone --nproc-per-node=2 _start_job.py``
                in a copy of the workdir (the SDK runs standalone: metrics to the console,
                checkpoints to ./checkpoints). End to end: from Popen to torchrun's exit.
    trainhouse  one server for the whole run (temporary home, free port), the same workdir
                submitted through ``trainhouse.client`` with the same epochs. End to end: from
                the call to ``submit()`` to the job's ``ended_at`` (when the server recorded it
                COMPLETED; the client's own view, polling every 0.1 s, is shown too).

What it prints
    Per side the median end to end and submit/launch-to-first-step; the end-to-end ratio
    (target <= 1.10) and first step - bare first step (target <= 1.0 s), each the median over
    the pairs of runs next to each other, with PASS or BELOW TARGET; and both runs' time by
    phase, from the timestamps the platform already records (the job's ``created_at`` and
    ``ended_at``, the attempt's ``started_at``, the exit records of the ranks and of torchrun),
    the start times of the processes and the job's own stamps. It exits 0 whatever the
    numbers (non-zero only when a run fails).

    python bench/start.py [--repeats 5] [--epochs 3] [--quiet-wait 30] [--json]
    python bench/start.py --smoke     # one run per side, 1 epoch: a check, not a number
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _machine import BUSY_PERCENT, log, machine_busy, wait_quiet
from overhead import free_port, rank_env, stop_tree, wait_healthy

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits"
JOB = Path(__file__).resolve().parent / "_start_job.py"
E2E_TARGET = 1.10  # trainhouse end to end / bare end to end, at most
FIRST_STEP_TARGET = 1.0  # seconds trainhouse's submit-to-first-step may exceed bare's
STAMPS_ENV = "BENCH_START_STAMPS"

#: the marks of a run in order, each the start of the phase named after it (a phase lasts until
#: the next mark the run has: the bare side has no server, supervisor or rank wrapper)
START_PHASES = [
    ("submit", "submit and upload (bare: Popen)"),
    ("created", "scheduler pick-up"),
    ("attempt_started", "unpack and launch"),
    ("supervisor", "supervisor"),
    ("torchrun", "torchrun"),
    ("wrapper", "rank wrapper"),
    ("process", "interpreter start"),
    ("script", "imports"),
    ("imported", "SDK init"),
    ("init_done", "data, model, DDP"),
    ("load_called", "checkpoint.load()"),
    ("load_done", "the first step"),
]
END_PHASES = [
    ("first_step", "training"),
    ("main_done", "interpreter exit (bare: and torchrun's)"),
    ("ranks_exited", "torchrun and supervisor exit"),
    ("launcher_exited", "the server notices"),
]


@dataclass
class Run:
    side: str  # "bare" or "trainhouse"
    e2e_s: float  # submit/launch to the end
    first_step_s: float  # submit/launch to the first step
    marks: dict[str, float]  # timestamp name -> seconds after submit/launch
    client_e2e_s: float | None = None  # trainhouse: until the client saw it end
    busy: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def make_workdir(root: Path, epochs: int) -> Path:
    """The job's workdir: the example's train.py, the stamping entrypoint and a spec."""
    work = root / "job"
    work.mkdir()
    shutil.copy2(EXAMPLE / "train.py", work / "train.py")
    shutil.copy2(JOB, work / "_start_job.py")
    spec = (EXAMPLE / "trainhouse.yaml").read_text()
    spec = spec.replace("entrypoint: python train.py", "entrypoint: python _start_job.py")
    spec = spec.replace("name: digits-cnn", "name: start-bench")
    (work / "trainhouse.yaml").write_text(spec)
    (work / ".trainhouseignore").write_text("checkpoints/\n")
    return work


def classify(cmdline: str) -> str | None:
    if "trainhouse.executors.node.supervise" in cmdline:
        return "supervisor"
    if "torch.distributed.run" in cmdline or "torchrun" in cmdline.split(" ")[0]:
        return "torchrun"
    if "trainhouse.executors.node.rank" in cmdline or "executors/rank.py" in cmdline:
        return "wrapper"
    return None


def read_stamps(folder: Path, procs: int) -> tuple[dict[str, float], list[list[Any]]]:
    """Rank 0's timestamps (first_step: the latest rank's) and rank 0's process chain."""
    ranks = [json.loads((folder / f"rank-{r}.json").read_text()) for r in range(procs)]
    marks = {k: float(v) for k, v in ranks[0].items() if isinstance(v, int | float)}
    for last in ("first_step", "main_done"):
        marks[last] = max(float(r[last]) for r in ranks)
    chain: list[list[Any]] = ranks[0]["chain"]
    marks["process"] = float(chain[0][1])
    for _pid, started, cmdline in chain[1:]:
        kind = classify(cmdline)
        if kind is not None and kind not in marks:
            marks[kind] = float(started)
    return marks, chain


def run_bare(work: Path, spec: Any, epochs: int, timeout: float) -> Run:
    with tempfile.TemporaryDirectory(prefix="trainhouse-bench-start-") as tmp:
        cwd = Path(tmp) / "job"
        shutil.copytree(work, cwd)
        stamps = Path(tmp) / "stamps"
        stamps.mkdir()
        env = rank_env(spec)
        env[STAMPS_ENV] = str(stamps)
        env["TMPDIR"] = tmp  # torchrun's and torch's scratch files, removed with the run
        env["BENCH_START_EPOCHS"] = str(epochs)  # standalone, the spec's hparams do not apply
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes=1",
            f"--nproc-per-node={spec.resources.procs}",
            "_start_job.py",
        ]
        began = time.time()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        finally:
            stop_tree(proc, grace=30)
        ended = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"the bare run failed (exit {proc.returncode}):\n{out[-3000:]}")
        marks, _chain = read_stamps(stamps, spec.resources.procs)
    marks["ended"] = ended
    marks["submit"] = began
    rel = {k: v - began for k, v in marks.items()}
    return Run("bare", ended - began, rel["first_step"], rel)


def read_time(path: Path) -> float:
    """The time of an exit record ("CODE TIME")."""
    return float(path.read_text().split()[1])


class Server:
    """One trainhouse server for every trainhouse run of the benchmark."""

    def __init__(self, home: Path, cpus: int) -> None:
        from trainhouse.client import Client

        port = free_port()
        self.home = home
        self.log_path = home / "server.log"
        cmd = [sys.executable, "-m", "trainhouse", "server", "--home", str(home)]
        cmd += ["--port", str(port), "--cpus", str(cpus), "--gpus", "0"]
        cmd += ["--log-level", "warning"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHOUSE_")}
        with self.log_path.open("ab") as fh:
            self.proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self.client = Client(f"http://127.0.0.1:{port}")
        wait_healthy(self.client, self.proc, self.log_path)

    def close(self) -> None:
        self.client.close()
        stop_tree(self.proc, grace=60)


def run_trainhouse(server: Server, work: Path, spec: Any, epochs: int, timeout: float) -> Run:
    client = server.client
    with tempfile.TemporaryDirectory(prefix="trainhouse-bench-start-") as tmp:
        stamps = Path(tmp)
        os.chmod(stamps, 0o700)
        overrides = [f"hparams.epochs={epochs}", f"env.{STAMPS_ENV}={stamps}"]
        began = time.time()
        job = client.submit(work / "trainhouse.yaml", overrides=overrides)
        deadline = time.monotonic() + timeout
        first_report = None
        while True:
            final = client.job(job["id"])
            if first_report is None and final["last_step"] is not None:
                first_report = time.time()  # the server has the first metric
            if final["state"] in ("COMPLETED", "FAILED", "CANCELED"):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job['id']} is still {final['state']}")
            time.sleep(0.1)
        client_end = time.time()
        if final["state"] != "COMPLETED":
            text, _, _ = client.logs(job["id"], rank=0, tail=40)
            raise RuntimeError(f"the trainhouse job ended {final['state']}:\n{text}")
        detail = client.job(job["id"])
        marks, _chain = read_stamps(stamps, spec.resources.procs)
    marks["submit"] = began
    if first_report is not None:
        marks["first_report"] = first_report
    marks["created"] = float(detail["created_at"])
    marks["attempt_started"] = float(detail["attempt_history"][0]["started_at"])
    marks["ended"] = float(detail["ended_at"])
    attempt = server.home / "jobs" / str(job["id"]) / "attempts" / "1"
    exits = [read_time(p) for p in attempt.glob("exit-rank-*")]
    if exits:
        marks["ranks_exited"] = max(exits)
    if (attempt / "exit-launcher").exists():
        marks["launcher_exited"] = read_time(attempt / "exit-launcher")
    rel = {k: v - began for k, v in marks.items()}
    return Run("trainhouse", rel["ended"], rel["first_step"], rel, client_e2e_s=client_end - began)


def phases(run: Run, table: list[tuple[str, str]], until: str) -> list[tuple[str, float]]:
    """(phase, seconds) of ``table``'s phases the run has, the last one ending at ``until``."""
    present = [(run.marks[mark], name) for mark, name in table if mark in run.marks]
    ends = [at for at, _name in present[1:]] + [run.marks[until]]
    return [(name, end - at) for (at, name), end in zip(present, ends, strict=True)]


def summarize(runs: list[Run], args: argparse.Namespace) -> dict[str, Any]:
    sides: dict[str, Any] = {}
    for side in ("bare", "trainhouse"):
        mine = [r for r in runs if r.side == side]
        by_phase: dict[str, list[float]] = {}
        for r in mine:
            for table, until in ((START_PHASES, "first_step"), (END_PHASES, "ended")):
                for name, seconds in phases(r, table, until):
                    by_phase.setdefault(name, []).append(seconds)
        sides[side] = {
            "e2e": statistics.median(r.e2e_s for r in mine),
            "e2e_runs": [r.e2e_s for r in mine],
            "first_step": statistics.median(r.first_step_s for r in mine),
            "first_step_runs": [r.first_step_s for r in mine],
            "phases": {k: statistics.median(v) for k, v in by_phase.items()},
        }
    th = [r for r in runs if r.side == "trainhouse"]
    sides["trainhouse"]["client_e2e"] = statistics.median(r.client_e2e_s or 0.0 for r in th)
    reported = [r.marks["first_report"] - r.first_step_s for r in th if "first_report" in r.marks]
    sides["trainhouse"]["first_report"] = statistics.median(reported) if reported else None
    bare, ours = sides["bare"], sides["trainhouse"]
    bares = [r for r in runs if r.side == "bare"]
    pairs = [t.e2e_s / b.e2e_s for b, t in zip(bares, th, strict=True)]
    extras = [t.first_step_s - b.first_step_s for b, t in zip(bares, th, strict=True)]
    # each trainhouse run against the bare run next to it (ABBA): drift of a shared machine
    # cancels out of the pairs better than out of the two sides' medians
    ratio = statistics.median(pairs)
    extra = statistics.median(extras)
    return {
        "epochs": args.epochs,
        "repeats": args.repeats,
        "bare": bare,
        "trainhouse": ours,
        "ratio": ratio,
        "pair_ratios": pairs,
        "pair_first_step_extras": extras,
        "ratio_target": E2E_TARGET,
        "ratio_pass": ratio <= E2E_TARGET,
        "first_step_extra": extra,
        "first_step_target": FIRST_STEP_TARGET,
        "first_step_pass": extra <= FIRST_STEP_TARGET,
        "busy_runs": sum(r.busy > BUSY_PERCENT for r in runs),
        "runs": len(runs),
    }


def print_table(s: dict[str, Any]) -> None:
    b, t = s["bare"], s["trainhouse"]
    print(
        f"digits example, 2 ranks (gloo, CPU), {s['epochs']} epochs; "
        f"{s['repeats']} runs per side in ABBA order; medians"
    )
    print()
    print(f"{'':<34}{'bare':>9}{'trainhouse':>12}")
    print(f"{'end to end, s':<34}{b['e2e']:>9.2f}{t['e2e']:>12.2f}")
    print(f"{'  (as the client saw it, 0.1 s polls)':<34}{'':>9}{t['client_e2e']:>12.2f}")
    print(f"{'submit/launch to first step, s':<34}{b['first_step']:>9.2f}{t['first_step']:>12.2f}")
    if t["first_report"] is not None:
        print(
            f"{'  first step to the first report':<34}{'':>9}{t['first_report']:>12.2f}"
            "   (the server has a metric; 0.1 s polls)"
        )
    print()
    for title, table in (
        ("submit/launch to the first step by phase", START_PHASES),
        ("the first step to the end by phase", END_PHASES),
    ):
        print(f"{title}, s (medians; a dash: not on that side)")
        for _mark, name in table:
            bv, tv = b["phases"].get(name), t["phases"].get(name)
            shown_b = f"{bv:>9.2f}" if bv is not None else f"{'-':>9}"
            shown_t = f"{tv:>12.2f}" if tv is not None else f"{'-':>12}"
            print(f"  {name:<38}{shown_b}{shown_t}")
    print()
    pairs, extras = s["pair_ratios"], s["pair_first_step_extras"]
    print(
        "pairs, end to end trainhouse/bare: "
        + " ".join(f"{r:.3f}" for r in pairs)
        + f" (min {min(pairs):.3f}, max {max(pairs):.3f})"
    )
    print(
        "pairs, first step trainhouse - bare, s: "
        + " ".join(f"{x:+.2f}" for x in extras)
        + f" (min {min(extras):+.2f}, max {max(extras):+.2f})"
    )
    if s["busy_runs"]:
        print(
            f"warning: around {s['busy_runs']} of {s['runs']} runs other processes used "
            f"> {BUSY_PERCENT:.0f}% of the CPUs; the numbers are unreliable"
        )
    verdict = "PASS" if s["ratio_pass"] else "BELOW TARGET"
    print(
        f"end to end trainhouse/bare (median of the pairs) = {s['ratio']:.3f} "
        f"(target <= {s['ratio_target']:.2f}): {verdict}"
    )
    verdict = "PASS" if s["first_step_pass"] else "BELOW TARGET"
    print(
        f"submit-to-first-step - bare start-to-first-step (median of the pairs) = "
        f"{s['first_step_extra']:+.2f} s "
        f"(target <= +{s['first_step_target']:.1f} s): {verdict}"
    )


def drive(args: argparse.Namespace) -> int:
    from trainhouse.spec import load_spec

    order: list[str] = []
    for i in range(args.repeats):
        order += ["bare", "trainhouse"] if i % 2 == 0 else ["trainhouse", "bare"]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="trainhouse-bench-start-") as tmp:
        root = Path(tmp)
        work = make_workdir(root, args.epochs)
        spec = load_spec(work / "trainhouse.yaml", [f"hparams.epochs={args.epochs}"])
        home = root / "home"
        home.mkdir()
        cpus = max(spec.resources.procs * spec.resources.cpus_per_proc, os.cpu_count() or 1)
        server = Server(home, cpus)
        try:
            for n, side in enumerate(order, 1):
                busy = wait_quiet(args.quiet_wait)
                log(f"[{n}/{len(order)}] {side} (CPU in use before: {busy:.0f}%) ...")
                if side == "bare":
                    run = run_bare(work, spec, args.epochs, args.timeout)
                else:
                    run = run_trainhouse(server, work, spec, args.epochs, args.timeout)
                after = machine_busy(0.5)
                run.busy = max(busy, after)
                log(f"    {run.e2e_s:.2f} s end to end, first step after {run.first_step_s:.2f} s")
                runs.append(run)
        finally:
            server.close()
    summary = summarize(runs, args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Start-up and end-to-end time of a short job, bare torchrun vs trainhouse."
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the job (3)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side (5)")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="seconds to wait before a run for other processes to leave the CPUs (30)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run (300)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--smoke", action="store_true", help="one run per side, 1 epoch, no quiet-wait"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.epochs, args.repeats, args.quiet_wait = 1, 1, 0.0
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
