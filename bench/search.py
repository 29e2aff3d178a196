"""Hyperparameter searches: what pruning saves, and what a pruning decision costs the server.

Part 1, the searcher (in process, Optuna's in-memory storage, trainhouse's own sampler and
pruner builders from ``trainhouse.tune.study``): a synthetic objective with a known optimum
whose trials report learning curves. A trial with hparams (lr, width, dropout) reports, at
each step s of ``STEPS``, ``floor(hparams) + 2 / sqrt(s + 1)`` plus a little noise, where the
floor is 0 at lr = 10**-2.5, width = 128, dropout = 0.1 and grows away from it. Two searches
spend the same budget of trial-steps (``--budget`` trials' worth of full trials):

- the baseline: random search, no pruning (every trial runs every step);
- TPE with ASHA (min_steps 4, reduction factor 3): pruned trials stop early, so the same
  budget runs more trials.

For each, over ``--seeds`` seeds: the trial-steps spent until the best finished trial's final
value is within ``TARGET`` of the optimum (trials-to-target as steps, the fair currency at a
step budget; the budget when never reached), and for TPE+ASHA the share of trial-steps pruning
saved (1 - steps run / the steps its trials would have run unpruned; goal >= 50%). It prints
the medians and the ratio of random's steps-to-target to TPE+ASHA's (goal > 1).

Part 2, the server (a real ``trainhouse server`` subprocess, SQLite, a temporary home): the
answer latency of the report route, which answers ``stop`` (``should_stop``) and, for a
trial, first feeds its value to the pruner. 8 jobs at once (``--jobs``; 2 with ``--smoke``)
each POST one report per step (one point, the job's credential, as the SDK's reporter does but
unbatched) and time every answer; twice in the same run: 8 plain jobs (the baseline: the route
without a search) and 8 trials of an ASHA search. It prints each p50 and p95, the trials' p95
against the goal of 50 ms, and the ratio of the trials' p95 to the plain jobs'.

    python bench/search.py [--smoke] [--seeds 5] [--budget 60] [--steps 200] [--jobs 8] [--json]

Exits 0 whatever the numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import optuna  # noqa: E402

from trainhouse.core.searchspec import SearchSpec, distributions  # noqa: E402
from trainhouse.tune import study as studies  # noqa: E402

TARGET = 0.05  # within this of the optimum's final value
GOAL_SAVED = 0.5
GOAL_P95_MS = 50.0
SPACE = {
    "lr": {"log_uniform": [1.0e-5, 1.0e-1]},
    "width": {"int": [16, 512]},
    "dropout": {"uniform": [0.0, 0.5]},
}


def floor(p: dict[str, Any]) -> float:
    return (
        (math.log10(p["lr"]) + 2.5) ** 2 * 0.5
        + (math.log2(p["width"] / 128.0)) ** 2 * 0.1
        + (p["dropout"] - 0.1) ** 2 * 4.0
    )


def curve(p: dict[str, Any], step: int, rng: random.Random) -> float:
    return floor(p) + 2.0 / math.sqrt(step + 1) + rng.gauss(0.0, 0.005)


def run_search(method: str, pruning: str, seed: int, budget: int, steps: int) -> dict[str, Any]:
    spec = SearchSpec.model_validate(
        {
            "method": method,
            "metric": "val_loss",
            "max_trials": 10_000,
            "early_stopping": {"method": pruning, "min_steps": 4, "reduction_factor": 3},
            "seed": seed,
        }
    )
    space = distributions(SPACE)
    study = optuna.create_study(direction="minimize", pruner=studies.pruner(spec))
    rng = random.Random(seed)
    optimum = 2.0 / math.sqrt(steps)  # floor 0, the last step
    spent = full = trials = 0
    reached: int | None = None
    best = math.inf
    while spent < budget * steps:
        study.sampler = studies.sampler(spec, space, trials)
        trial = study.ask()
        params = {name: studies.suggest(trial, name, d) for name, d in space.items()}
        trials += 1
        full += steps
        value = math.inf
        pruned = False
        for step in range(steps):
            value = curve(params, step, rng)
            spent += 1
            trial.report(value, step)
            if trial.should_prune():
                pruned = True
                break
            if spent >= budget * steps:
                break
        if pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        study.tell(trial, value)
        best = min(best, value)
        if reached is None and best <= optimum + TARGET:
            reached = spent
    return {
        "trials": trials,
        "steps": spent,
        "steps_to_target": reached if reached is not None else budget * steps,
        "reached": reached is not None,
        "saved": 1.0 - spent / full,
        "best": best,
    }


def part1(seeds: int, budget: int, steps: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"random": [], "tpe+asha": []}
    for seed in range(seeds):
        runs["random"].append(run_search("random", "none", seed, budget, steps))
        runs["tpe+asha"].append(run_search("tpe", "asha", seed, budget, steps))
    out: dict[str, Any] = {"seeds": seeds, "budget_steps": budget * steps}
    for name, found in runs.items():
        out[name] = {
            "trials": statistics.median(r["trials"] for r in found),
            "steps_to_target": statistics.median(r["steps_to_target"] for r in found),
            "reached": sum(r["reached"] for r in found),
            "saved": statistics.median(r["saved"] for r in found),
            "best": statistics.median(r["best"] for r in found),
        }
    out["ratio"] = out["random"]["steps_to_target"] / max(out["tpe+asha"]["steps_to_target"], 1)
    return out


# -- part 2: the server ------------------------------------------------------------------------
REPORTER = """
import json, os, time, uuid, urllib.request

url = os.environ["TRAINHOUSE_URL"].rstrip("/")
job = os.environ["TRAINHOUSE_JOB_ID"]
token = os.environ["TRAINHOUSE_JOB_TOKEN"]
attempt = int(os.environ["TRAINHOUSE_ATTEMPT"])
hp = json.loads(os.environ["TRAINHOUSE_HPARAMS"])
steps, lr = int(hp["steps"]), float(hp.get("lr", 0.01))
took = []
for step in range(steps):
    body = json.dumps({
        "batch_id": uuid.uuid4().hex, "attempt": attempt,
        "columns": {"step": [step], "name": ["val_loss"],
                    "value": [abs(lr - 0.01) * 100 + 1.0 / (step + 1)], "rank": [None],
                    "wall_time": [time.time()]},
    }).encode()
    request = urllib.request.Request(
        f"{url}/api/v1/jobs/{job}/report", data=body, method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                 "X-Trainhouse-Request": "1"})
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as answer:
        stop = json.loads(answer.read())["stop"]
    took.append(time.perf_counter() - began)
    if stop:
        break
    time.sleep(0.01)
print("LATENCIES " + json.dumps(took), flush=True)
"""

PLAIN = """
name: plain
entrypoint: python report.py
hparams: {{steps: {steps}}}
"""

TRIALS = """
name: trials
entrypoint: python report.py
hparams: {{steps: {steps}, lr: {{log_uniform: [1.0e-4, 1.0]}}}}
search:
  method: tpe
  metric: val_loss
  max_trials: {jobs}
  max_concurrent: {jobs}
  early_stopping: {{method: asha, min_steps: 4, reduction_factor: 3}}
  seed: 0
"""


def latencies(client: Any, job_ids: list[int]) -> list[float]:
    out: list[float] = []
    for job_id in job_ids:
        text = client.logs(job_id)[0]
        for line in text.splitlines():
            if line.startswith("LATENCIES "):
                out += json.loads(line.removeprefix("LATENCIES "))
    return out


def wait_ended(client: Any, job_ids: list[int], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while any(client.job(j)["state"] not in ("COMPLETED", "FAILED", "CANCELED") for j in job_ids):
        if time.monotonic() > deadline:
            raise SystemExit("the reporting jobs did not end in time")
        time.sleep(0.3)


def part2(steps: int, jobs: int) -> dict[str, Any]:
    from trainhouse.client import Client
    from trainhouse.client.serverprocess import ServerProcess, free_port

    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        root = Path(tmp)
        wd = root / "wd"
        wd.mkdir()
        (wd / "report.py").write_text(textwrap.dedent(REPORTER))
        (wd / "plain.yaml").write_text(PLAIN.format(steps=steps))
        (wd / "trials.yaml").write_text(TRIALS.format(steps=steps, jobs=jobs))
        server = ServerProcess(root / "home", free_port(), "--cpus", str(jobs), "--gpus", "0")
        server.start(timeout=120)
        try:
            with Client(server.url) as c:
                plain = [c.submit(wd / "plain.yaml")["id"] for _ in range(jobs)]
                wait_ended(c, plain)
                base = latencies(c, plain)
                search = c.submit_search(wd / "trials.yaml")
                deadline = time.monotonic() + 300
                while (view := c.search(search["id"]))["state"] == "RUNNING":
                    if time.monotonic() > deadline:
                        raise SystemExit("the search did not end in time")
                    time.sleep(0.3)
                trial_jobs = [t["job_id"] for t in view["trials"]]
                tuned = latencies(c, trial_jobs)
                pruned = sum(t["state"] == "PRUNED" for t in view["trials"])
        finally:
            server.stop()

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0

    return {
        "reports": {"plain": len(base), "trials": len(tuned)},
        "plain_p50_ms": pct(base, 0.5),
        "plain_p95_ms": pct(base, 0.95),
        "trials_p50_ms": pct(tuned, 0.5),
        "trials_p95_ms": pct(tuned, 0.95),
        "pruned_trials": pruned,
        "ratio": pct(tuned, 0.95) / max(pct(base, 0.95), 1e-9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a quick run (< 20 s)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=60, help="full trials' worth of steps")
    parser.add_argument("--steps", type=int, default=200, help="steps of a full trial")
    parser.add_argument("--report-steps", type=int, default=100, help="part 2: steps per job")
    parser.add_argument("--jobs", type=int, default=8, help="part 2: jobs reporting at once")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.smoke:
        args.seeds, args.budget, args.steps, args.report_steps, args.jobs = 1, 15, 60, 6, 2
    began = time.perf_counter()
    one = part1(args.seeds, args.budget, args.steps)
    two = part2(args.report_steps, args.jobs)
    result = {"searcher": one, "server": two, "seconds": time.perf_counter() - began}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    r, t = one["random"], one["tpe+asha"]
    print(
        f"searcher: {args.seeds} seed(s), a budget of {one['budget_steps']} trial-steps "
        f"({args.budget} full trials of {args.steps} steps)"
    )
    print(
        f"  random, no pruning: {r['trials']:.0f} trials, target reached in {r['reached']}/"
        f"{args.seeds}, steps to target {r['steps_to_target']:.0f}, best {r['best']:.4f}"
    )
    print(
        f"  TPE + ASHA:         {t['trials']:.0f} trials, target reached in {t['reached']}/"
        f"{args.seeds}, steps to target {t['steps_to_target']:.0f}, best {t['best']:.4f}"
    )
    print(
        f"  steps saved by pruning: {t['saved']:.0%} (goal >= {GOAL_SAVED:.0%}: "
        f"{'met' if t['saved'] >= GOAL_SAVED else 'NOT met'})"
    )
    print(
        f"  steps to target, random / TPE+ASHA: {one['ratio']:.2f} "
        f"(goal > 1: {'met' if one['ratio'] > 1 else 'NOT met'})"
    )
    print(
        f"server: report answers (should_stop), {args.jobs} jobs at once, one report per step "
        f"({two['reports']['plain']} plain, {two['reports']['trials']} trial reports; "
        f"{two['pruned_trials']} trials pruned)"
    )
    print(f"  plain jobs: p50 {two['plain_p50_ms']:.1f} ms, p95 {two['plain_p95_ms']:.1f} ms")
    met = "met" if two["trials_p95_ms"] < GOAL_P95_MS else "NOT met"
    print(
        f"  trials:     p50 {two['trials_p50_ms']:.1f} ms, p95 {two['trials_p95_ms']:.1f} ms "
        f"(goal < {GOAL_P95_MS:.0f} ms: {met})"
    )
    print(f"  trials p95 / plain p95: {two['ratio']:.2f}")


if __name__ == "__main__":
    main()
