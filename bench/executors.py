"""The same 1-node job under the local executor and under the Ray executor, in the same run.

Two real servers (``trainhouse.client.serverprocess.ServerProcess``: temporary homes, free ports)
run side by side: one with the local executor (``--cpus`` as given), one with
``--executor ray`` connected to a one-node Ray cluster this benchmark starts itself
(``ray.cluster_utils.Cluster``: the head with ``--cpus`` CPUs, an 80 MiB object store, no
dashboard, usage stats off, its own temp dir; shut down at the end, never ``ray stop``). Each
run submits the same job, written to a temporary workdir: ``--procs`` DDP ranks (gloo,
``OMP_NUM_THREADS=1``) training a small MLP on random batches of 256 for ``--steps`` steps,
logging ``loss`` every step and ``samples_per_s`` (``batch * world_size / seconds``) every 25.

Submit to first step
    ``time.time()`` just before ``Client.submit`` (which packs and uploads the workdir) to the
    ``wall_time`` of the job's first ``loss`` point. Under Ray this includes creating the
    placement group, starting one actor, shipping the code to it and starting torchrun there.

Steady-state samples/s
    The median of the ``samples_per_s`` windows after the first ``--warmup`` (2).

Runs alternate local / ray in ABBA order, ``--repeats`` (2) of each; each job is waited for
until it completes before the next is submitted. It prints the medians of both executors and
the ratios ray / local (latency: how many times longer; throughput: the fraction kept), and
exits 0 whatever the numbers: it is a benchmark, not a test. Like the others it waits for a
quiet machine first and warns when the CPUs were busy.

    python bench/executors.py [--quick] [--repeats 2] [--steps 400] [--procs 2] [--cpus 2]
                              [--quiet-wait 60] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from _machine import BUSY_PERCENT, log, machine_busy, wait_quiet

SCRIPT = """
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import trainhouse

with trainhouse.init(hparams={"steps": 400, "batch": 256, "window": 25}) as run:
    steps, batch, window = (int(run.hparams[k]) for k in ("steps", "batch", "window"))
    run.set_total_steps(steps)
    torch.manual_seed(run.rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
    )
    ddp = DDP(model) if run.world_size > 1 else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    began = time.perf_counter()
    for step in range(steps):
        x = torch.randn(batch, 64)
        loss = torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        values = {"loss": loss.item()}
        if step % window == window - 1:
            now = time.perf_counter()
            values["samples_per_s"] = window * batch * run.world_size / (now - began)
            began = now
        run.log(values, step=step)
"""

SPEC = """
name: executors-bench
entrypoint: python train.py
workdir: .
resources: {{nodes: 1, procs_per_node: {procs}, gpus_per_node: 0, cpus_per_proc: 1}}
hparams: {{steps: {steps}, batch: 256, window: 25}}
env: {{OMP_NUM_THREADS: "1"}}
"""

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def points(client: Any, job_id: int, name: str) -> list[list[Any]]:
    series = client.metrics(job_id, name=name)["series"]
    return [p for s in series if s["rank"] is None for p in s["points"]]


def run_job(client: Any, spec: Path, args: argparse.Namespace) -> dict[str, float]:
    """Submit, wait for the end; (submit -> first step latency, steady samples/s)."""
    submit_at = time.time()
    job_id = int(client.submit(spec)["id"])
    final = client.wait(job_id, timeout=args.timeout, poll=0.25)
    if final["state"] != "COMPLETED":
        text, _, _ = client.logs(job_id, rank=0, tail=20)
        raise RuntimeError(f"job {job_id} ended {final['state']}: {final['reason']}\n{text}")
    loss = points(client, job_id, "loss")
    first = min(float(p[2]) for p in loss)
    windows = [float(p[1]) for p in sorted(points(client, job_id, "samples_per_s"))]
    steady = windows[args.warmup :] or windows
    return {"latency": first - submit_at, "samples_per_s": statistics.median(steady)}


def start_cluster(cpus: int, tmp: Path) -> Any:
    from ray.cluster_utils import Cluster

    os.environ["RAY_TMPDIR"] = str(tmp)  # not the machine's /tmp/ray: nothing joins it by chance
    os.environ.update(RAY_ENV)
    return Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={
            "num_cpus": cpus,
            "include_dashboard": False,
            "object_store_memory": 80 * 1024 * 1024,
        },
    )


def bench(args: argparse.Namespace) -> dict[str, Any]:
    from trainhouse.client import Client
    from trainhouse.client.serverprocess import ServerProcess, free_port

    busy = wait_quiet(args.quiet_wait)
    tmp = Path(tempfile.mkdtemp(prefix="th-bench-", dir="/tmp"))  # short: Ray's socket paths
    wd = tmp / "job"
    wd.mkdir()
    (wd / "train.py").write_text(textwrap.dedent(SCRIPT).lstrip())
    spec = wd / "trainhouse.yaml"
    spec.write_text(textwrap.dedent(SPEC).lstrip().format(procs=args.procs, steps=args.steps))
    for key in [k for k in os.environ if k.startswith("TRAINHOUSE_")]:
        del os.environ[key]  # the servers get --home; a job's ranks get their own variables
    cluster = None
    servers: dict[str, ServerProcess] = {}
    results: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
    try:
        log(f"starting a Ray cluster and two servers in {tmp} (CPU in use before: {busy:.0f}%)")
        cluster = start_cluster(args.cpus, tmp / "ray")
        servers["local"] = ServerProcess(tmp / "local", free_port(), "--cpus", str(args.cpus))
        servers["ray"] = ServerProcess(
            tmp / "rayhome",
            free_port(),
            "--executor",
            "ray",
            "--ray-address",
            str(cluster.address),
            "--ray-node-dir",
            str(tmp / "nodes"),
        )
        for server in servers.values():
            server.start()
        order = ["local", "ray", "ray", "local"] * ((args.repeats + 1) // 2)
        order = order[: 2 * args.repeats]
        for i, name in enumerate(order, 1):
            with Client(servers[name].url) as client:
                result = run_job(client, spec, args)
            results[name].append(result)
            log(
                f"[{i}/{len(order)}] {name:5}: first step {result['latency']:.2f} s after "
                f"submit, {result['samples_per_s']:.0f} samples/s"
            )
    finally:
        for server in servers.values():
            with contextlib.suppress(Exception):
                server.stop()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    after = machine_busy()
    med = {
        name: {k: statistics.median(r[k] for r in runs) for k in ("latency", "samples_per_s")}
        for name, runs in results.items()
    }
    return {
        "procs": args.procs,
        "steps": args.steps,
        "repeats": args.repeats,
        "runs": results,
        "median": med,
        "latency_ratio": med["ray"]["latency"] / med["local"]["latency"],
        "throughput_ratio": med["ray"]["samples_per_s"] / med["local"]["samples_per_s"],
        "busy_percent": max(busy, after),
    }


def print_report(s: dict[str, Any]) -> None:
    print(
        f"one node, {s['procs']} DDP rank(s) over gloo, {s['steps']} steps; "
        f"{s['repeats']} run(s) per executor (ABBA)"
    )
    print()
    print(f"{'executor':10}{'submit -> first step':>24}{'steady samples/s':>20}")
    for name in ("local", "ray"):
        m = s["median"][name]
        print(f"{name:10}{m['latency']:>22.2f} s{m['samples_per_s']:>20.0f}")
    print()
    if s["busy_percent"] > BUSY_PERCENT:
        print(
            f"warning: the CPUs were {s['busy_percent']:.0f}% busy before or after the runs; "
            "the numbers are unreliable, rerun on a quieter machine"
        )
    print(f"ratio ray/local, submit -> first step = {s['latency_ratio']:.2f}")
    print(f"ratio ray/local, steady samples/s     = {s['throughput_ratio']:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 run each, 200 steps")
    parser.add_argument(
        "--smoke", action="store_true", help="1 run each, 75 steps, no quiet wait (the suite's)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per executor")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--procs", type=int, default=2, help="DDP ranks of the job")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the node (both executors)")
    parser.add_argument("--warmup", type=int, default=2, help="windows of 25 steps dropped")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--quiet-wait", type=float, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 1, 200
    if args.smoke:
        args.repeats, args.steps, args.warmup, args.quiet_wait = 1, 75, 1, 0.0
    try:
        import ray  # noqa: F401
    except ImportError:
        log("this benchmark needs Ray: pip install 'trainhouse[ray]'")
        return 2
    summary = bench(args)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        print()
    else:
        print_report(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
