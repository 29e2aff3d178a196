"""How fast does the ``trainhouse`` command start? ``--help`` and ``ps``, against the interpreter.

Every run is a fresh process, as a user starts one: ``python -m trainhouse ARGS`` with this
checkout's ``src`` first on ``PYTHONPATH`` (so it measures the working tree, not whatever is
installed), stdout and stderr to /dev/null, timed with ``time.perf_counter`` from spawning the
process to reaping it. The cases:

- ``python -c pass``: the interpreter alone; the baseline every ratio is taken against;
- ``trainhouse --help``: the command list (typer's rich help);
- ``trainhouse ps`` against a port on 127.0.0.1 where nothing listens: the whole client path
  up to a refused connection (exit code 3, "cannot reach the trainhouse server");
- ``trainhouse ps`` against a real server (a ``ServerProcess``: a temporary home, a free port,
  ``--cpus 2 --gpus 0``, no jobs; started once, before the timed runs, and stopped at the end),
  unless ``--no-server``;
- with ``--before REF``, the same trainhouse cases for the CLI as committed at git ``REF``
  (``git archive REF src`` unpacked into a temporary directory, run with the same interpreter
  and packages), so that before and after are measured in the same run.

After one untimed warm-up run per case (it writes the bytecode caches) the cases take turns,
round after round, ``--repeats`` rounds (20; ``--quick``: 5), so that whatever else the machine
does hurts all of them alike. It prints each case's median and fastest wall time, the median's
ratio to the baseline's median, and for the trainhouse cases whether the median is under the
goal of 0.3 s; and each case's median CPU time (user + system, from the child's resource
usage), which waiting for a busy machine's CPUs does not inflate (sharing its caches still
does): on a busy machine it is the better guess at the quiet wall time. Like the other
benchmarks it waits for a quiet machine first (``--quiet-wait``) and reports how much of the
CPUs other processes used during the timed runs.

    python bench/cli.py [--quick] [--repeats 20] [--no-server] [--before REF] [--json]

It is a benchmark, not a test: it exits 0 whatever the numbers (1 if a command does not end as
it should, e.g. ``ps`` against the real server failing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _machine import BUSY_PERCENT, log, wait_quiet

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 0.3  # what trainhouse --help and trainhouse ps should start and end within


@dataclass
class Case:
    label: str
    argv: list[str]
    src: Path | None  # the trainhouse source first on PYTHONPATH; None: the baseline
    exit_code: int
    goal: bool  # compared with GOAL_S
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the child's user + system seconds

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def child_env(src: Path | None) -> dict[str, str]:
    """The environment of a timed command: no TRAINHOUSE_* variables (``--url`` says where),
    a fixed terminal width, and ``src`` first on PYTHONPATH. Nor PYTHONDONTWRITEBYTECODE: the
    warm-up run must write the bytecode caches an installed package has, or every timed run
    compiles trainhouse's modules again (50-70 ms of CPU for ``ps`` on a busy 2-core machine)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TRAINHOUSE_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["COLUMNS"] = "120"
    if src is not None:
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(src), *rest])
    return env


def children_cpu_seconds() -> float:
    """User + system seconds of this process's reaped children (the server is reaped last)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(case: Case) -> tuple[float, float]:
    """One run of ``case``: its wall time and its CPU time, in seconds."""
    env = child_env(case.src)
    cpu0 = children_cpu_seconds()
    start = time.perf_counter()
    proc = subprocess.run(case.argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    cpu = children_cpu_seconds() - cpu0
    if proc.returncode != case.exit_code:
        raise SystemExit(
            f"{case.label}: exit code {proc.returncode}, expected {case.exit_code}\n"
            + proc.stderr.decode(errors="replace")[-2000:]
        )
    return elapsed, cpu


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def source_at(ref: str) -> Iterator[Path]:
    """``src`` as committed at ``ref``, unpacked into a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="trainhouse-bench-cli-") as tmp:
        archive = Path(tmp) / "src.tar"
        subprocess.run(
            ["git", "archive", "--format=tar", "-o", str(archive), ref, "src"], cwd=ROOT, check=True
        )
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp) / "src"


@contextlib.contextmanager
def real_server(enabled: bool) -> Iterator[tuple[str | None, psutil.Process | None]]:
    """A trainhouse server of this checkout (URL and process), or (None, None)."""
    if not enabled:
        yield None, None
        return
    os.environ["PYTHONPATH"] = child_env(ROOT / "src")["PYTHONPATH"]  # the server's too
    sys.path.insert(0, str(ROOT / "src"))
    from trainhouse.client.serverprocess import ServerProcess, free_port

    with tempfile.TemporaryDirectory(prefix="trainhouse-bench-cli-home-") as home:
        server = ServerProcess(Path(home), free_port(), "--cpus", "2", "--gpus", "0")
        log(f"starting a server at {server.url} (log: {server.log})")
        server.start(timeout=120)
        try:
            assert server.proc is not None
            yield server.url, psutil.Process(server.proc.pid)
        finally:
            server.stop()


def cases_for(label: str, src: Path, refused: str, server_url: str | None) -> list[Case]:
    """The trainhouse cases for the source ``src``, their labels prefixed with ``label``."""
    python = [sys.executable, "-m", "trainhouse"]
    out = [
        Case(f"{label}trainhouse --help", [*python, "--help"], src, 0, True),
        Case(
            f"{label}trainhouse ps (nothing listening)",
            [*python, "ps", "--url", refused],
            src,
            3,
            True,
        ),
    ]
    if server_url is not None:
        out.append(
            Case(
                f"{label}trainhouse ps (a real server)",
                [*python, "ps", "--url", server_url],
                src,
                0,
                True,
            )
        )
    return out


def cpu_busy_seconds() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def own_cpu_seconds(server: psutil.Process | None) -> float:
    """This process's CPU time, its finished children's (the timed commands) and the server's."""
    t = psutil.Process().cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    if server is not None:
        with contextlib.suppress(psutil.Error):
            s = server.cpu_times()
            total += s.user + s.system
    return float(total)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    refused = f"http://127.0.0.1:{unused_port()}"
    with contextlib.ExitStack() as stack:
        server_url, server_proc = stack.enter_context(real_server(not args.no_server))
        cases = [Case("python -c pass (baseline)", [sys.executable, "-c", "pass"], None, 0, False)]
        cases += cases_for("", ROOT / "src", refused, server_url)
        if args.before:
            before = stack.enter_context(source_at(args.before))
            cases += cases_for(f"[{args.before}] ", before, refused, server_url)
        busy_before = wait_quiet(args.quiet_wait)
        for case in cases:  # warm-up: bytecode caches, the server's first request
            run_once(case)
        log(f"timing {len(cases)} cases x {args.repeats} runs")
        all0, own0, t0 = cpu_busy_seconds(), own_cpu_seconds(server_proc), time.perf_counter()
        for _ in range(args.repeats):
            for case in cases:
                elapsed, cpu = run_once(case)
                case.times.append(elapsed)
                case.cpu.append(cpu)
        span = time.perf_counter() - t0
        others = cpu_busy_seconds() - all0 - (own_cpu_seconds(server_proc) - own0)
        others_percent = max(0.0, 100 * others / (span * (psutil.cpu_count() or 1)))
    base = cases[0].median
    base_cpu = statistics.median(cases[0].cpu) or 1e-9
    return {
        "repeats": args.repeats,
        "goal_s": GOAL_S,
        "python": sys.version.split()[0],
        "busy_before_percent": busy_before,
        "others_percent": others_percent,
        "cases": [
            {
                "case": c.label,
                "median_s": c.median,
                "min_s": min(c.times),
                "ratio_to_baseline": c.median / base,
                "cpu_median_s": statistics.median(c.cpu),
                "cpu_ratio_to_baseline": statistics.median(c.cpu) / base_cpu,
                "meets_goal": (c.median < GOAL_S) if c.goal else None,
                "runs_s": c.times,
            }
            for c in cases
        ],
    }


def print_report(r: dict[str, Any]) -> None:
    print(
        f"trainhouse start-up: median wall time of {r['repeats']} runs per case (cases "
        f"interleaved), Python {r['python']}; ratio = median / the baseline's median; cpu = "
        "median user + system time"
    )
    for c in r["cases"]:
        line = (
            f"  {c['case']:<48} {c['median_s'] * 1000:7.1f} ms  (fastest {c['min_s'] * 1000:6.1f})"
            f"  ratio {c['ratio_to_baseline']:5.1f}  cpu {c['cpu_median_s'] * 1000:6.1f} ms"
            f" (ratio {c['cpu_ratio_to_baseline']:4.1f})"
        )
        if c["meets_goal"] is not None:
            verdict = "PASS" if c["meets_goal"] else "ABOVE GOAL"
            line += f"   goal < {r['goal_s'] * 1000:.0f} ms: {verdict}"
        print(line)
    by_label = {c["case"]: c for c in r["cases"]}
    for c in r["cases"]:
        if c["case"].startswith("["):
            after = by_label.get(c["case"].split("] ", 1)[1])
            if after is not None:
                wall = after["median_s"] / c["median_s"]
                cpu = after["cpu_median_s"] / c["cpu_median_s"]
                print(f"  after / before, {after['case']:<34} {wall:.2f}  (cpu {cpu:.2f})")
    print(f"other processes used {r['others_percent']:.0f}% of the CPUs during the timed runs")
    if r["others_percent"] > BUSY_PERCENT:
        print("warning: the machine was busy; the times are inflated, rerun on a quieter one")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="How fast trainhouse --help and ps start.")
    parser.add_argument("--quick", action="store_true", help="5 runs per case")
    parser.add_argument(
        "--smoke", action="store_true", help="1 run per case, no quiet wait (the suite's check)"
    )
    parser.add_argument("--repeats", type=int, help="timed runs per case (20; --quick: 5)")
    parser.add_argument(
        "--no-server", action="store_true", help="skip ps against a real server (saves its start)"
    )
    parser.add_argument("--before", metavar="REF", help="also time the CLI as committed at git REF")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        help="seconds to wait for other processes to leave the CPUs first (30; --quick: 5)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 5 if args.quick else 20
    if args.quiet_wait is None:
        args.quiet_wait = 0.0 if args.smoke else 5.0 if args.quick else 30.0
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    results = measure(args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
