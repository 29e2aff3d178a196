"""Checks a GPU machine end to end in under 9 minutes, and prints what passed and the numbers.

    .venv/bin/python bench/gpu_check.py                     # on the GPU machine (one GPU)
    .venv/bin/python bench/gpu_check.py --smoke             # tiny sizes on the CPU, no NVML
    .venv/bin/python bench/gpu_check.py --only sdk,fsdp     # some steps

Each step runs as a child process of its own (``python -m _gpu.STEP``, in a directory of its
own under one temporary directory) with a time budget: one that hangs is killed at its budget
and reported, and the others still run. The steps (``bench/_gpu/``, one module each):

inventory   NVML finds the GPU (name, memory, UUID); torch's device 0 has the same UUID; NVML
            attributes a 4 GiB tensor to the process that allocated it.
sdk         ``trainhouse.init()`` standalone: ``run.device`` is ``cuda:0``; a ~1B-parameter
            bf16 GPT with Adam saved blocking and in the background while training goes on,
            each reloaded bit-identical to a CPU snapshot taken at the save; the CUDA RNG
            restored; staging GB/s.
fsdp        FSDP2 (``fully_shard``) on one rank over NCCL, sharded saves through the SDK
            blocking and in the background, reloaded bit-identical; the group destroyed.
executor    a real ``trainhouse server`` (temporary home, free port): a 1-GPU job sees its GPU,
            allocates 100 GiB, is canceled, and NVML shows the GPU empty within 5 s of its exit.
throughput  a 6-layer GPT (d_model 768, seq 1024, bf16 autocast) trained bare and as a job of
            that server, the same steps; tokens/s of each and the ratio (goal >= 0.98, fails
            below 0.9).

Every item is PASS, FAIL, SKIP (with why) or INFO (a number); the exit code is 1 when anything
failed. ``--smoke`` runs the same code with tiny sizes on the CPU (gloo for NCCL, 16 MiB for
100 GiB, a declared GPU for the server), skipping what needs NVML or CUDA, so that the script's
own logic can be run on any machine. ``pytest tests/gpu`` runs the same steps as tests.
Nothing is downloaded: the models are built in place and trained on random tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _gpu.common import Item, clean_env, read_items

BENCH = Path(__file__).resolve().parent
SRC = BENCH.parent / "src"
TOTAL = 520.0  # seconds for every step and the server's start; its stop comes on top
STOP_RESERVE = 15.0  # seconds kept for stopping the server
LOG_TAIL = 25  # lines of a failed step's output shown


@dataclass(frozen=True)
class Step:
    name: str
    budget: float  # seconds
    server: bool  # needs the check's trainhouse server
    what: str


STEPS = (
    Step("inventory", 60, False, "what NVML and torch see"),
    Step("sdk", 160, False, "the SDK on one rank: a ~1B bf16 model's checkpoints"),
    Step("fsdp", 60, False, "FSDP2 on one rank over NCCL: sharded checkpoints"),
    Step("executor", 60, True, "a 1-GPU job canceled: its GPU freed"),
    Step("throughput", 150, True, "tokens/s bare and through trainhouse"),
)
SERVER_BUDGET = 30.0


def step_env(step: Step) -> dict[str, str]:
    paths = [str(BENCH), str(SRC), os.environ.get("PYTHONPATH", "")]
    env = clean_env(PYTHONPATH=os.pathsep.join(p for p in paths if p), PYTHONUNBUFFERED="1")
    if step.name == "fsdp":  # rank 0 of a world of 1; the step joins the group itself
        from trainhouse.client.serverprocess import free_port

        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
        )
    return env


def run_step(step: Step, tmp: Path, timeout: float, smoke: bool, url: str | None) -> list[Item]:
    """Run one step as a child process (its own session, killed whole past ``timeout``)."""
    work = tmp / step.name
    work.mkdir()
    result = work / "items.jsonl"
    output = work / "output.log"
    cmd = [sys.executable, "-m", f"_gpu.{step.name}", "--result", str(result)]
    cmd += ["--budget", f"{timeout:.0f}"] + (["--smoke"] if smoke else [])
    cmd += ["--url", url] if url else []
    with output.open("wb") as fh:
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            env=step_env(step),
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        code: int | None = None
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:  # even on Ctrl-C: the step's session does not get the terminal's signals
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the step and anything it left behind
            proc.wait()
    items = read_items(result)
    failed = any(i.status == "FAIL" for i in items)
    if code is None:
        items.append(Item(step.name, "finished in time", "FAIL", f"killed after {timeout:.0f} s"))
    elif code != 0 and not failed:
        items.append(Item(step.name, "exit code", "FAIL", f"the step exited {code}"))
    if code != 0:  # killed, or crashed: what it printed last says where
        lines = output.read_text(errors="replace").splitlines()[-LOG_TAIL:]
        text = "the step's last lines:\n" + "\n".join(lines)
        items.append(Item(step.name, "output", "INFO", text))
    return items


# -- the server ----------------------------------------------------------------------------------
def start_server(tmp: Path, smoke: bool) -> tuple[Any, Item]:
    """A trainhouse server on a free port, its home in ``tmp``; (server or None, its item)."""
    from trainhouse.client.serverprocess import ServerProcess, free_port
    from trainhouse.errors import ServerStartError

    # a smoke run declares a GPU (jobs get CUDA_VISIBLE_DEVICES=0); a GPU machine's is NVML's
    args = ["--cancel-grace", "2", "--log-level", "warning"]
    args += ["--gpus", "1", "--cpus", str(max(2, os.cpu_count() or 1))] if smoke else []
    server = ServerProcess(tmp / "home", free_port(), *args, log=tmp / "server.log")
    start = time.monotonic()
    try:
        server.start(timeout=SERVER_BUDGET)
    except ServerStartError as exc:
        return None, Item("server", "started", "FAIL", str(exc)[-2000:])
    with server_client(server) as client:
        gpus = [g for n in client.nodes()["nodes"] for g in n["gpus"]]
    offered = ", ".join(f"{g['index']}: {g['model']} {g['uuid'] or ''}".strip() for g in gpus)
    elapsed = time.monotonic() - start
    detail = f"{server.url} in {elapsed:.1f} s, offering {len(gpus)} GPU(s): {offered or 'none'}"
    return server, Item("server", "started", "PASS" if gpus else "FAIL", detail)


def server_client(server: Any) -> Any:
    from trainhouse.client import Client

    return Client(server.url)


def settle(server: Any, timeout: float = 20.0) -> None:
    """Cancel what an earlier step left running on the server, and wait for it to end (a
    server that does not answer has nothing to settle: the next step reports it)."""
    from trainhouse.errors import ClientError
    from trainhouse.lifecycle import TERMINAL

    with server_client(server) as client, contextlib.suppress(ClientError):
        active = [j["id"] for j in client.jobs() if j["state"] not in TERMINAL]
        for job_id in active:
            with contextlib.suppress(ClientError):  # it may have ended meanwhile
                client.cancel(job_id)
        deadline = time.monotonic() + timeout
        while active and time.monotonic() < deadline:
            active = [i for i in active if client.job(i)["state"] not in TERMINAL]
            time.sleep(0.5)


# -- the report ------------------------------------------------------------------------------------
def show(items: list[Item]) -> None:
    for item in items:
        first, *rest = item.detail.splitlines() or [""]
        print(f"  {item.status:<5} {item.name}: {first}")
        for line in rest:
            print(f"        {line}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check a GPU machine end to end (< 9 min).")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--only", help="comma-separated steps: " + ", ".join(s.name for s in STEPS))
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else [s.name for s in STEPS]
    unknown = set(names) - {s.name for s in STEPS}
    if unknown:
        parser.error(f"unknown steps: {', '.join(sorted(unknown))}")
    chosen = [s for s in STEPS if s.name in names]
    for key in set(os.environ) - set(clean_env()):
        del os.environ[key]  # the server and its jobs are the check's own, standalone runs too
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p
    )  # this checkout's trainhouse, for the server and its jobs as well
    mode = "smoke: tiny sizes on the CPU" if args.smoke else "full sizes"
    print(f"trainhouse GPU check ({mode}), at most {TOTAL + STOP_RESERVE:.0f} s", flush=True)
    started = time.monotonic()
    deadline = started + TOTAL
    tmp = Path(tempfile.mkdtemp(prefix="trainhouse-gpu-check-"))
    scratch = tmp / "scratch"  # torch's and torchrun's scratch files, removed with the rest
    scratch.mkdir()
    os.environ["TMPDIR"] = str(scratch)
    items: list[Item] = []
    server: Any = None
    try:
        for step in chosen:
            if step.server and server is None:
                server, item = start_server(tmp, args.smoke)
                items.append(item)
                print("== server")
                show([item])
            timeout = min(step.budget, deadline - time.monotonic())
            if step.server and server is None:
                found = [Item(step.name, "ran", "FAIL", "not run: no server")]
            elif timeout < 10:
                found = [Item(step.name, "ran", "FAIL", "not run: out of time")]
            else:
                if step.server:
                    settle(server)
                began = time.monotonic()
                print(f"== {step.name}: {step.what} (budget {timeout:.0f} s) ...", flush=True)
                found = run_step(step, tmp, timeout, args.smoke, server and server.url)
                print(f"   {step.name} took {time.monotonic() - began:.1f} s")
            items += found
            show(found)
    finally:
        if server is not None:
            settle(server, timeout=5.0)
            server.stop(timeout=STOP_RESERVE - 5)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    counts = {s: sum(i.status == s for i in items) for s in ("PASS", "FAIL", "SKIP")}
    print(
        f"summary: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP "
        f"in {time.monotonic() - started:.0f} s"
    )
    for item in items:
        if item.status == "FAIL":
            print(f"  FAIL  {item.step}: {item.name}")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
