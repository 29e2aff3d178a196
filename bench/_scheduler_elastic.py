"""Part 3 of ``scheduler.py``: the same day's arrivals with elastic jobs, against all fixed.

The arrivals are part 2's (same seed, load, span and cluster). In the **elastic** mix a share
(``--elastic``, 0.4) of the multi-GPU jobs is elastic down to a quarter or a half of its size
(``_scheduler_mix.elastic_demand``, drawn from a stream of its own so the arrivals do not
change); in the **fixed** mix every job runs at its largest size, which is part 2's policy
run. Both go through ``simulate`` with the real policy (the incremental path).

What the simulation assumes (``trainhouse.scheduler.simulate``): linear scaling (a job at half
its size runs half as fast; its work is rank-seconds), a resize stops the job at a checkpoint
with no work lost and its next attempt spends 60 s in setup holding its GPUs (counted as held:
the utilisation below includes it, and the setup GPU-hours are printed), growth is considered
after 300 s at a size. An elastic job that declares a ``max_runtime`` declares one that holds at
its least size (its full-size figure x largest / least world, plus the setup): the policy
reserves and backfills by it, and one that ran past it would be taken to end at any moment.

Utilisation is measured over the fixed run's steady-state window (part 2's), the same window
for both, and over the whole day. Queue wait is first start - submission for the jobs arriving
in the window (an elastic job's first start at any size; a job never started counts as
waiting until the end of the day); the time to finish (submission to end) of the jobs that
finished in both runs is printed beside it, since an elastic job that starts small ends later
than its start suggests. The goal: utilisation elastic / fixed >= 1.10 over the window, with
the mean and the median queue wait no worse.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace
from typing import Any

from _machine import log
from _scheduler_day import arrivals, bound, hms, ratio
from _scheduler_mix import GPUS_PER_NODE, cluster, elastic_demand, multi_gpu, percentile

from trainhouse.scheduler.incremental import Scheduler
from trainhouse.scheduler.simulate import RESIZE_OVERHEAD, SimJob, SimResult, simulate

UTILISATION_GOAL = 1.10  # elastic / fixed, over the window


def wait_ratio(elastic: float, fixed: float) -> float:
    """elastic / fixed; 1 when both are 0 (no wait either way)."""
    return 1.0 if elastic == fixed == 0 else ratio(elastic, fixed)


def make_elastic(jobs: list[SimJob], share: float, seed: int) -> list[SimJob]:
    """``jobs`` with ``share`` of the multi-GPU ones elastic (their own random stream)."""
    rng = random.Random(seed * 1_000_003 + 30)
    out = []
    for job in jobs:
        if multi_gpu(job.demand) and rng.random() < share:
            d = elastic_demand(rng, job.demand)
            least = d.min_nodes * d.min_procs
            declared = job.max_runtime
            if declared is not None:  # it must hold at the least size, setup included
                declared = declared * d.world / least + RESIZE_OVERHEAD
            job = replace(job, demand=d, max_runtime=declared)
        out.append(job)
    return out


def waits(
    jobs: list[SimJob], result: SimResult, span: float, which: set[int] | None = None
) -> dict[str, float]:
    """Mean, median and p90 of first start - submission (unstarted: until ``span``)."""
    w = [
        result.started.get(j.id, span) - j.submit_at for j in jobs if which is None or j.id in which
    ]
    if not w:
        return {"jobs": 0, "mean_s": 0.0, "median_s": 0.0, "p90_s": 0.0, "not_started": 0}
    return {
        "jobs": len(w),
        "mean_s": statistics.fmean(w),
        "median_s": statistics.median(w),
        "p90_s": percentile(w, 90),
        "not_started": sum(
            1 for j in jobs if (which is None or j.id in which) and j.id not in result.started
        ),
    }


def run(name: str, nodes: Any, jobs: list[SimJob], span: float) -> tuple[SimResult, float]:
    log(f"part 3: simulating the day, {name} ...")
    t0 = time.perf_counter()
    result = simulate(nodes, jobs, policy=Scheduler(), until=span)
    return result, time.perf_counter() - t0


def part3(args: argparse.Namespace) -> dict[str, Any]:
    nodes = cluster(args.sim_nodes)
    total_gpus = sum(len(n.gpus) for n in nodes)
    span = args.hours * 3600.0
    fixed_jobs = arrivals(args.seed, span, args.load, total_gpus)
    elastic_jobs = make_elastic(fixed_jobs, args.elastic, args.seed)
    made = {j.id for j in elastic_jobs if j.demand.elastic}
    fixed, fixed_wall = run("all fixed", nodes, fixed_jobs, span)
    flex, flex_wall = run(f"{len(made)} jobs elastic", nodes, elastic_jobs, span)
    # the fixed run's steady-state window (part 2's), for both
    start = fixed.first_wait
    end = max((j.submit_at for j in fixed_jobs), default=span)
    steady_state = start is not None and start < end
    if start is None or start >= end:
        start, end = 0.0, span
    steady = [j for j in fixed_jobs if start <= j.submit_at <= end]
    steady_flex = [j for j in elastic_jobs if start <= j.submit_at <= end]
    others = {j.id for j in fixed_jobs} - made
    both = set(fixed.finished) & set(flex.finished)
    by_id = {j.id: j for j in fixed_jobs}

    def finish(result: SimResult) -> dict[str, float]:
        t = [result.finished[i] - by_id[i].submit_at for i in both] or [0.0]
        return {"jobs": len(both), "mean_s": statistics.fmean(t), "median_s": statistics.median(t)}

    def side(result: SimResult, wall: float, jobs: list[SimJob]) -> dict[str, Any]:
        grows = sum(1 for _, old, new, _ in result.resizes if new[0] * new[1] > old[0] * old[1])
        return {
            "utilisation": result.utilisation_between(start, end, total_gpus),
            "utilisation_day": result.utilisation(total_gpus, until=span),
            "wait": waits(jobs, result, span),
            "wait_elastic_jobs": waits(jobs, result, span, made),
            "wait_other_jobs": waits(jobs, result, span, others),
            "finish_of_jobs_finished_in_both": finish(result),
            "started": len(result.started),
            "finished": len(result.finished),
            "preemptions": len(result.preemptions),
            "resizes": len(result.resizes),
            "grows": grows,
            "shrinks": len(result.resizes) - grows,
            "setup_gpu_hours": result.setup_gpu_seconds / 3600,
            "lost_job_hours": result.lost_seconds / 3600,
            "decisions": len(result.decision_seconds),
            "wall_s": wall,
        }

    f, e = side(fixed, fixed_wall, steady), side(flex, flex_wall, steady_flex)
    upper = bound(fixed_jobs, start, end, total_gpus)
    util_ratio = ratio(e["utilisation"], f["utilisation"])
    mean_ratio = wait_ratio(e["wait"]["mean_s"], f["wait"]["mean_s"])
    median_ratio = wait_ratio(e["wait"]["median_s"], f["wait"]["median_s"])
    waits_ok = (
        e["wait"]["mean_s"] <= f["wait"]["mean_s"]
        and e["wait"]["median_s"] <= f["wait"]["median_s"]
    )
    return {
        "cluster": f"{len(nodes)} nodes x {GPUS_PER_NODE} GPUs",
        "hours": args.hours,
        "arrivals": len(fixed_jobs),
        "multi_gpu_jobs": sum(1 for j in fixed_jobs if multi_gpu(j.demand)),
        "elastic_jobs": len(made),
        "elastic_share_target": args.elastic,
        "window_s": [start, end],
        "steady_state": steady_state,
        "steady_arrivals": len(steady),
        "upper_bound": upper,
        "fixed": f,
        "elastic": e,
        "utilisation_ratio": util_ratio,
        # the most any schedule of the fixed arrivals could gain over the fixed run
        "utilisation_ceiling_ratio": ratio(min(upper, 1.0), f["utilisation"]),
        "mean_wait_ratio": mean_ratio,
        "median_wait_ratio": median_ratio,
        "goal": {"utilisation_ratio": UTILISATION_GOAL, "wait": "mean and median no worse"},
        "met": util_ratio >= UTILISATION_GOAL and waits_ok,
        "utilisation_met": util_ratio >= UTILISATION_GOAL,
        "waits_met": waits_ok,
    }


def print_elastic(p3: dict[str, Any]) -> None:
    print(
        f"Part 3: the same {p3['hours']:g} h of arrivals on {p3['cluster']}, "
        f"{p3['elastic_jobs']} of the {p3['multi_gpu_jobs']} multi-GPU jobs elastic "
        f"(target share {p3['elastic_share_target']:.0%}; least = 1/4 or 1/2 of the most) "
        "against all fixed at their most"
    )
    start, end = p3["window_s"]
    where = "the fixed run's steady-state window" if p3["steady_state"] else "the whole day"
    print(f"window: {where}, {hms(start)} to {hms(end)}; {p3['steady_arrivals']} jobs arrive in it")
    f, e = p3["fixed"], p3["elastic"]
    print(f"{'':<40}{'fixed':>12}{'elastic':>12}{'ratio':>8}")

    def row(label: str, a: float, b: float, fmt: str = ".3f") -> None:
        print(f"{label:<40}{a:>12{fmt}}{b:>12{fmt}}{ratio(b, a):>8.3f}")

    def wrow(label: str, a: float, b: float) -> None:
        print(f"{label:<40}{hms(a):>12}{hms(b):>12}{wait_ratio(b, a):>8.3f}")

    row("GPU utilisation, window", f["utilisation"], e["utilisation"])
    row("GPU utilisation, whole day", f["utilisation_day"], e["utilisation_day"])
    wrow("queue wait, mean (window arrivals)", f["wait"]["mean_s"], e["wait"]["mean_s"])
    wrow("queue wait, median", f["wait"]["median_s"], e["wait"]["median_s"])
    wrow("queue wait, p90", f["wait"]["p90_s"], e["wait"]["p90_s"])
    for key, label in (
        ("wait_elastic_jobs", "jobs made elastic"),
        ("wait_other_jobs", "the others"),
    ):
        a, b = f[key], e[key]
        wrow(f"  mean wait, {label} ({a['jobs']})", a["mean_s"], b["mean_s"])
    a, b = f["finish_of_jobs_finished_in_both"], e["finish_of_jobs_finished_in_both"]
    wrow(f"time to finish, mean ({a['jobs']} in both)", a["mean_s"], b["mean_s"])
    wrow("time to finish, median", a["median_s"], b["median_s"])
    for label, key in (
        ("jobs started", "started"),
        ("jobs finished", "finished"),
        ("preemptions", "preemptions"),
        ("resizes (shrinks / grows)", "resizes"),
        ("decisions", "decisions"),
    ):
        extra = f" ({e['shrinks']} / {e['grows']})" if key == "resizes" else ""
        print(f"{label:<40}{f[key]:>12}{e[key]:>12}{extra}")
    print(
        f"{'setup after resizes (GPU-hours)':<40}{f['setup_gpu_hours']:>12.1f}"
        f"{e['setup_gpu_hours']:>12.1f}"
    )
    print(
        f"{'work lost to preemption (job-hours)':<40}{f['lost_job_hours']:>12.1f}"
        f"{e['lost_job_hours']:>12.1f}"
    )
    print(f"{'simulation wall time':<40}{f['wall_s']:>11.1f}s{e['wall_s']:>11.1f}s")
    verdict = "PASS" if p3["met"] else "BELOW TARGET"
    print(
        f"goal: utilisation elastic / fixed = {p3['utilisation_ratio']:.3f} (>= "
        f"{p3['goal']['utilisation_ratio']:.2f}: {'met' if p3['utilisation_met'] else 'not met'})"
        f"; queue wait mean {p3['mean_wait_ratio']:.3f}, median {p3['median_wait_ratio']:.3f} "
        f"(<= 1: {'met' if p3['waits_met'] else 'not met'}): {verdict}"
    )
    print(
        f"  the fixed run already holds {f['utilisation']:.3f} of the GPUs in the window; the "
        f"window's upper bound is {p3['upper_bound']:.3f}, so no schedule could do better than "
        f"{p3['utilisation_ceiling_ratio']:.3f} x the fixed run's utilisation there"
    )
