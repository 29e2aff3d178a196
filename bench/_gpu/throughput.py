"""Step ``throughput``: the small GPT trained bare and through trainhouse, tokens/s of each.

Both sides run the same file, ``_gpu/gpt.py``, copied alone into a directory of its own, with
the same model, batch, synthetic tokens, ``OMP_NUM_THREADS`` and GPU:

- bare: ``python gpt.py`` in a child process, no trainhouse imported, no server involved. Its
  calibration steps size the timed part (about ``Sizes.throughput_seconds``);
- through trainhouse: the same directory submitted to the check's server as a 1-GPU job with
  ``--trainhouse --steps N`` (the bare run's N): ``trainhouse.init()``, ``run.log`` of the loss
  every ``log_every`` steps, ``run.should_stop()`` every step.

Warm-up and calibration steps are untimed on both sides; the timed part starts and ends with a
device synchronize. The ratio (trainhouse / bare, goal >= 0.98) is a measurement; the step
fails only below :data:`FLOOR`, or when a side fails.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _gpu import gpt
from _gpu.common import Results, Sizes, clean_env, millions, sizes, step_main
from _gpu.jobs import offered_gpu, submit, tail

GOAL = 0.98
FLOOR = 0.9


def arguments(size: Sizes, steps: int) -> list[str]:
    return [
        "--config",
        json.dumps(asdict(size.throughput)),
        "--batch",
        str(size.throughput_batch),
        "--warmup",
        str(size.warmup),
        "--calibrate",
        str(size.calibrate),
        "--steps",
        str(steps),
        "--seconds",
        str(size.throughput_seconds),
        "--log-every",
        str(size.log_every),
    ]


def parse(output: str) -> dict[str, Any] | None:
    lines = [ln for ln in output.splitlines() if ln.startswith(gpt.RESULT)]
    return json.loads(lines[-1][len(gpt.RESULT) :]) if lines else None


def bare(size: Sizes, workdir: Path, visible: str, timeout: float) -> dict[str, Any]:
    env = clean_env(
        CUDA_VISIBLE_DEVICES=visible,
        OMP_NUM_THREADS=str(size.cpus_per_proc),
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.run(
        [sys.executable, "gpt.py", *arguments(size, 0)],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    result = parse(proc.stdout)
    if proc.returncode != 0 or result is None:
        out = proc.stdout + proc.stderr
        raise RuntimeError(f"the bare run exited {proc.returncode}:\n{out[-2000:]}")
    return result


def body(results: Results, args: argparse.Namespace) -> None:
    from trainhouse.client import Client

    size = sizes(args.smoke)
    started = time.monotonic()
    workdir = Path("gpt-job").resolve()
    workdir.mkdir()
    shutil.copy(Path(gpt.__file__), workdir / "gpt.py")
    with Client(args.url) as client:
        _, visible = offered_gpu(client)
        first = bare(size, workdir, visible, timeout=args.budget * 0.4)
        cfg = size.throughput
        results.info(
            "bare",
            f"{first['tokens_per_s']:,.0f} tokens/s: {first['steps']} steps of "
            f"{size.throughput_batch} x {cfg.seq} tokens in {first['seconds']:.1f} s on "
            f"{first['device']}, {first['threads']} CPU threads (GPT of {millions(cfg.params)} "
            f"parameters, {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, "
            "bf16 autocast)",
            tokens_per_s=first["tokens_per_s"],
            steps=first["steps"],
        )
        spec = {
            "name": "gpu-check-throughput",
            "entrypoint": shlex.join(
                ["python", "gpt.py", *arguments(size, first["steps"]), "--trainhouse"]
            ),
            "resources": {"nodes": 1, "gpus_per_node": 1, "cpus_per_proc": size.cpus_per_proc},
        }
        job = submit(client, workdir, spec)
        left = args.budget - (time.monotonic() - started) - 10
        final = client.wait(int(job["id"]), timeout=max(10.0, left), poll=1.0)
        job_id = int(job["id"])
        text, _, _ = client.logs(job_id, rank=0)
        second = parse(text)
        if final["state"] != "COMPLETED" or second is None:
            raise RuntimeError(f"the job ended {final['state']}:\n{tail(client, job_id)}")
        points = client.metrics(job_id, name="loss")["series"]
        logged = sum(len(s["points"]) for s in points)
    results.info(
        "through trainhouse",
        f"{second['tokens_per_s']:,.0f} tokens/s: {second['steps']} steps in "
        f"{second['seconds']:.1f} s on {second['device']}, {second['threads']} CPU threads, "
        f"job {job_id}",
        tokens_per_s=second["tokens_per_s"],
    )
    expected = second["steps"] // size.log_every
    results.check(
        "metrics reached the server",
        logged >= expected,
        f"{logged} loss points stored ({expected} logged in the timed part)",
    )
    ratio = second["tokens_per_s"] / first["tokens_per_s"]
    verdict = "goal met" if ratio >= GOAL else "BELOW GOAL"
    detail = f"trainhouse / bare = {ratio:.3f} (goal >= {GOAL}: {verdict}"
    if args.smoke:  # a few seconds of a tiny model on shared CPUs: noise, not a measurement
        results.info("throughput ratio", f"{detail}; not judged in a smoke run)", ratio=ratio)
    else:
        judged = f"{detail}; fails below {FLOOR})"
        results.check("throughput ratio", ratio >= FLOOR, judged, ratio=ratio)


def extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True)


if __name__ == "__main__":
    step_main("throughput", body, extra)
