"""Part 2 of ``scheduler.py``: a simulated day of arrivals, the policy against FIFO.

Utilisation is measured over the steady-state window as well as over the whole day: the day
starts with an empty cluster and an empty queue, and for the first hours any policy keeps up
with the arrivals, so the whole-day figure mostly measures the start. The window opens when the
policy's queue first stays non-empty after a decision (from then on jobs wait for room: the
cluster is as full as that policy gets it) and closes at the last arrival (after it the queue
only drains). FIFO and the upper bound are measured over the same window.

The upper bound over a window [t0, t1] counts for each job only the GPU-seconds it could hold
there: its GPUs x min(runtime, t1 - max(submission, t0)), and none if it arrives after t1; the
sum over (GPUs x (t1 - t0)), capped at 1. It ignores that work done before t0 no longer needs
doing, so it is still an upper bound, but it no longer credits a job arriving an hour before
the end with eight hours of work.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from _machine import log
from _scheduler_mix import (
    GPUS_PER_NODE,
    NODES,
    TIERS,
    Users,
    cluster,
    demand,
    make_users,
    percentile,
    pick,
)

from trainhouse.core.cluster import Node
from trainhouse.scheduler.incremental import Scheduler
from trainhouse.scheduler.policy import Decisions, Snapshot
from trainhouse.scheduler.simulate import SimJob, SimResult, fifo_decide, simulate
from trainhouse.spec import PRIORITY_TIERS


def sim_job(rng: random.Random, users: Users, job_id: int, submit_at: float) -> SimJob:
    runtime = math.exp(rng.uniform(math.log(300), math.log(8 * 3600)))
    r = rng.random()
    if r < 0.20:
        max_runtime: float | None = runtime * rng.uniform(1.0, 1.25)
    elif r < 0.25:
        max_runtime = runtime * rng.uniform(3, 10)
    else:
        max_runtime = None
    return SimJob(
        id=job_id,
        owner=rng.choices(users.names, users.weights)[0],
        priority=pick(rng, TIERS),
        submit_at=submit_at,
        demand=demand(rng),
        runtime=runtime,
        max_runtime=max_runtime,
        checkpoint_every=rng.choice((600.0, 900.0, 1800.0)),
    )


def mean_gpu_seconds(seed: int, users: Users, samples: int = 20_000) -> float:
    """Expected GPU-seconds per job of the arrival mix (a sample from its own stream)."""
    rng = random.Random(seed + 7919)
    total = 0.0
    for i in range(samples):
        j = sim_job(rng, users, i, 0.0)
        total += j.demand.nodes * j.demand.gpus * j.runtime
    return total / samples


def arrivals(seed: int, span: float, load: float, total_gpus: int) -> list[SimJob]:
    rng = random.Random(seed)
    users = make_users(rng)
    rate = load * total_gpus / mean_gpu_seconds(seed, users)  # jobs per second
    jobs: list[SimJob] = []
    t = rng.expovariate(rate)
    while t < span:
        jobs.append(sim_job(rng, users, len(jobs) + 1, t))
        t += rng.expovariate(rate)
    return jobs


def bound(jobs: list[SimJob], start: float, end: float, total_gpus: int) -> float:
    """The most of the GPUs the jobs could hold over [start, end] (see the module's text)."""
    if end <= start:
        return 0.0
    held = sum(
        j.demand.nodes * j.demand.gpus * min(j.runtime, max(end - max(j.submit_at, start), 0.0))
        for j in jobs
    )
    return min(1.0, held / (total_gpus * (end - start)))


def by_tier(job: SimJob) -> tuple[int, str]:
    return -PRIORITY_TIERS.index(job.priority), job.priority


def by_size(job: SimJob) -> tuple[int, str]:
    d = job.demand
    return d.nodes * d.gpus, f"{d.nodes}x{d.gpus} GPU"


def waits(
    jobs: list[SimJob],
    result: SimResult,
    span: float,
    group_of: Callable[[SimJob], tuple[int, str]],
) -> dict[str, dict[str, float]]:
    """Median and p90 wait (first start - submission) per group; unstarted jobs wait until
    ``span`` (for a group with such jobs the figures are lower bounds).

    ``group_of`` gives a job's (sort key, group name).
    """
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    unstarted: dict[tuple[int, str], int] = defaultdict(int)
    for j in jobs:
        start = result.started.get(j.id)
        if start is None:
            unstarted[group_of(j)] += 1
            start = span
        groups[group_of(j)].append(start - j.submit_at)
    return {
        name: {
            "jobs": len(groups[(key, name)]),
            "median_wait_s": statistics.median(groups[(key, name)]),
            "p90_wait_s": percentile(groups[(key, name)], 90),
            "not_started": unstarted[(key, name)],
        }
        for key, name in sorted(groups)
    }


def run_sim(
    name: str,
    nodes: list[Node],
    jobs: list[SimJob],
    span: float,
    policy: Callable[[Snapshot], Decisions],
) -> tuple[SimResult, dict[str, Any]]:
    log(f"part 2: simulating the day with {name} ...")
    t0 = time.perf_counter()
    result = simulate(nodes, jobs, policy=policy, until=span)
    wall = time.perf_counter() - t0
    total_gpus = sum(len(n.gpus) for n in nodes)
    ms = [t * 1000 for t in result.decision_seconds] or [0.0]
    return result, {
        "utilisation_day": result.utilisation(total_gpus, until=span),
        "first_wait_s": result.first_wait,
        "preemptions": len(result.preemptions),
        "lost_job_seconds": result.lost_seconds,
        "finished": len(result.finished),
        "started": len(result.started),
        "decisions": len(result.decision_seconds),
        "decision_median_ms": statistics.median(ms),
        "decision_p99_ms": percentile(ms, 99),
        "wall_s": wall,
    }


def part2(args: argparse.Namespace) -> dict[str, Any]:
    nodes = cluster(args.sim_nodes)
    total_gpus = sum(len(n.gpus) for n in nodes)
    span = args.hours * 3600.0
    jobs = arrivals(args.seed, span, args.load, total_gpus)
    demanded = sum(j.demand.nodes * j.demand.gpus * j.runtime for j in jobs)
    capacity = total_gpus * span
    # the policy through the incremental path (the same decisions as decide(): unit-tested)
    pol_result, policy = run_sim("the policy", nodes, jobs, span, Scheduler())
    fifo_result, fifo = run_sim("FIFO without backfill", nodes, jobs, span, fifo_decide)
    start = pol_result.first_wait
    end = max((j.submit_at for j in jobs), default=span)
    steady_state = start is not None and start < end
    if start is None or start >= end:  # never saturated before the last arrival: the day
        start, end = 0.0, span
    steady = [j for j in jobs if start <= j.submit_at <= end]
    for out, result in ((policy, pol_result), (fifo, fifo_result)):
        out["utilisation"] = result.utilisation_between(start, end, total_gpus)
        out["waits_by_tier"] = waits(steady, result, span, by_tier)
        out["waits_by_size"] = waits(steady, result, span, by_size)
    upper = bound(jobs, start, end, total_gpus)
    day_bound = bound(jobs, 0.0, span, total_gpus)
    return {
        "cluster": f"{len(nodes)} nodes x {GPUS_PER_NODE} GPUs",
        "reduced": len(nodes) != NODES or args.hours != 24,
        "hours": args.hours,
        "arrivals": len(jobs),
        "load_target": args.load,
        "demand_over_capacity": demanded / capacity,
        "window_s": [start, end],
        "steady_state": steady_state,
        "steady_arrivals": len(steady),
        "upper_bound": upper,
        "upper_bound_day": day_bound,
        "loose_bound_day": min(1.0, demanded / capacity),
        "policy": policy,
        "fifo": fifo,
        "policy_over_fifo": ratio(policy["utilisation"], fifo["utilisation"]),
        "policy_over_bound": ratio(policy["utilisation"], upper),
        "fifo_over_bound": ratio(fifo["utilisation"], upper),
        "day_policy_over_bound": ratio(policy["utilisation_day"], day_bound),
    }


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def hms(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def print_day(p2: dict[str, Any]) -> None:
    print(
        f"Part 2: {p2['hours']:g} h of Poisson arrivals on {p2['cluster']}: {p2['arrivals']} jobs, "
        f"demand {p2['demand_over_capacity']:.2f} x capacity (target {p2['load_target']:.2f})"
    )
    if p2["reduced"]:
        print("note: REDUCED from the full 25 x 8 cluster and 24 h day")
    start, end = p2["window_s"]
    if p2["steady_state"]:
        print(
            f"steady-state window: {hms(start)} (the policy's queue first stays non-empty) to "
            f"{hms(end)} (the last arrival); {p2['steady_arrivals']} jobs arrive in it"
        )
    else:
        print(
            "no steady state: the policy's queue never stayed non-empty before the last "
            "arrival; the 'window' figures are the whole day's"
        )
    pol, fifo = p2["policy"], p2["fifo"]
    print(f"{'':<30}{'policy':>12}{'FIFO':>12}{'bound':>10}")
    print(
        f"{'GPU utilisation, window':<30}{pol['utilisation']:>12.3f}{fifo['utilisation']:>12.3f}"
        f"{p2['upper_bound']:>10.3f}"
    )
    print(
        f"{'GPU utilisation, whole day':<30}{pol['utilisation_day']:>12.3f}"
        f"{fifo['utilisation_day']:>12.3f}{p2['upper_bound_day']:>10.3f}"
    )
    for label, key in (
        ("jobs started", "started"),
        ("jobs finished", "finished"),
        ("preemptions", "preemptions"),
        ("decisions", "decisions"),
    ):
        print(f"{label:<30}{pol[key]:>12}{fifo[key]:>12}")
    print(
        f"{'work lost (job-hours)':<30}{pol['lost_job_seconds'] / 3600:>12.1f}"
        f"{fifo['lost_job_seconds'] / 3600:>12.1f}"
    )
    dp = f"{pol['decision_median_ms']:.1f} / {pol['decision_p99_ms']:.1f}"
    df = f"{fifo['decision_median_ms']:.1f} / {fifo['decision_p99_ms']:.1f}"
    print(f"{'decision median / p99 ms':<30}{dp:>12}{df:>12}")
    print(f"{'simulation wall time':<30}{pol['wall_s']:>11.1f}s{fifo['wall_s']:>11.1f}s")
    print(
        "queue wait of the jobs arriving in the window, median / p90 (policy | FIFO); "
        "a job not started by the end waits until then:"
    )
    for key in ("waits_by_tier", "waits_by_size"):
        for group, w in pol[key].items():
            f = fifo[key][group]
            label = f"  {group} ({w['jobs']})"
            print(
                f"{label:<18}{hms(w['median_wait_s']):>9} /{hms(w['p90_wait_s']):>9}  |"
                f"{hms(f['median_wait_s']):>9} /{hms(f['p90_wait_s']):>9}"
                f"   not started: {w['not_started']} | {f['not_started']}"
            )
    print(
        f"the whole day's loose bound min(1, demand / capacity) = {p2['loose_bound_day']:.3f}; "
        f"policy / it = {ratio(pol['utilisation_day'], p2['loose_bound_day']):.3f}"
    )
    print(f"window: utilisation policy / FIFO        = {p2['policy_over_fifo']:.3f}")
    print(f"window: utilisation policy / upper bound = {p2['policy_over_bound']:.3f}")
    print(f"window: utilisation FIFO / upper bound   = {p2['fifo_over_bound']:.3f}")
