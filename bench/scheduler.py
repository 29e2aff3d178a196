"""How fast is one scheduling decision, and how well does the policy use a cluster, with and
without elastic jobs?

Part 1: decision time
    A simulated cluster of 25 nodes x 8 GPUs (64 CPU cores each) and a sequence of snapshots
    of it as the scheduler loop would build them, one per tick: running jobs on concrete,
    non-overlapping GPUs filling most of the cluster (about 90% of the GPUs; low to urgent
    tiers, some with a ``max_runtime``, a few already stopping), and a queue of mixed jobs:
    gangs of 1, 2, 4 or 8 GPUs on one node and some of 2-4 nodes x 8 GPUs; mostly ``normal``
    tier, some ``low``/``high``, few ``urgent``; ~50 users with different decayed usage, a few
    with a share of 2 and a few with a GPU quota; some jobs declare a ``max_runtime``. From one
    tick to the next the queue changes as a busy server's does (``--churn``, 8: that many jobs
    leave it, started or canceled, and as many new ones arrive; one job in 1,000 changes
    priority), the running set is drawn afresh, the usage moves by up to 5% and ``now`` moves
    on 30 s. Two paths decide on every snapshot:

    * ``decide(snapshot)``, the pure from-scratch reference (``trainhouse.scheduler.policy``):
      it groups and sorts the whole queue and walks all of it every time;
    * ``Scheduler.decide(snapshot)`` (``trainhouse.scheduler.incremental``), what the loop
      and the simulation use: it keeps the queue indexed between ticks, takes the snapshot's
      queue by its differences (``QueueIndex.sync``, timed as part of the call), and walks
      once per epoch between starts. Its first call, which builds the index, is timed apart.

    Each call is timed with ``time.perf_counter`` (and ``time.process_time``, this process's
    CPU time, as a cross-check) after a ``gc.collect()``; the snapshots are built beforehand.
    After each pair of calls (untimed) the two decisions are compared: they must be equal. At
    1,000, 10,000 and 100,000 queued jobs it prints the median and the p99 (linear
    interpolation between order statistics: with 30 calls the p99 is close to the slowest
    call), and for the incremental path the median over the target: < 50 ms at 10,000 and
    < 500 ms at 100,000, with PASS or BELOW TARGET.

    A further row (``--elastic-sizes``, 10,000) times the same at a queue with elastic jobs
    (``--elastic-queued``, 15% of the queued jobs: multi-GPU jobs made elastic down to a quarter
    or a half of their size by ``_scheduler_mix.elastic_demand``) and 30% of the multi-GPU
    running jobs elastic (about 10), each running at a size drawn from its range, with a
    ``resize_interval`` of 300 s: the walk tries an elastic job's larger sizes before its
    least, and the pass may shrink and grow running ones. The same target applies.

    The times are only as good as the machine is quiet. Before part 1 the benchmark waits up to
    ``--quiet-wait`` (60 s) for other processes to leave the CPUs, measures how much of the
    CPUs other processes used during the timed calls, and warns above 15%.

Part 2: GPU utilisation over a simulated day (``_scheduler_day.py``)
    Seeded Poisson arrivals over a day (``--hours``, 24), at a rate chosen so that the expected
    GPU-seconds demanded equal ``--load`` (1.05) times the cluster's capacity over that span
    (the realised demand varies with the seed; it is printed): the same size and tier mix as
    above, runtimes log-uniform from 5 minutes to 8 hours, ~20% declare a ``max_runtime`` at or
    a little above (<= 1.25x) their real runtime, ~5% a generous one (3-10x), the rest none;
    checkpoints every 10-30 minutes. The arrivals are run through
    ``trainhouse.scheduler.simulate.simulate`` (discrete events, from an empty cluster of
    ``--sim-nodes`` x 8 GPUs, 25) with the real policy (the incremental path) and with
    ``fifo_decide`` (submission order, head of line blocks, no backfill, no preemption), both
    up to the end of the day. Utilisation is GPU-seconds held (work later lost to a preemption
    included) / (GPUs x span), over the **steady-state window**: from the moment the policy's
    queue first stays non-empty after a decision to the last arrival, the same window for
    FIFO and the bound; the whole day is printed too. The upper bound over a window credits
    each job with at most its GPUs x min(runtime, time left in the window after it arrives).
    It prints utilisations, the ratios policy/FIFO and policy/bound (and FIFO/bound), the
    preemptions, and the median and p90 queue wait per tier and per gang size of the jobs
    arriving in the window (first start - submission; a job not started by the end of the day
    counts as waiting until then, so for a group with such jobs the figures are lower bounds).

Part 3: elastic jobs over the same day (``_scheduler_elastic.py``)
    Part 2's arrivals again, with ``--elastic`` (40%) of the multi-GPU jobs elastic down to a
    quarter or a half of their size, against the same arrivals all fixed at their largest size
    (part 2's policy run), both with the policy. The simulation scales linearly (a job at half
    its size runs half as fast), a resize loses no work but costs its next attempt 60 s of
    setup, and an elastic job's declared ``max_runtime`` holds at its least size. It prints
    utilisation over the fixed run's steady-state window (and the day), the mean, median and
    p90 queue wait of the jobs arriving in it, the time to finish of the jobs finished in both,
    resizes, preemptions and setup, the ratios elastic / fixed, and the goal: utilisation
    >= 1.10 x, mean and median queue wait no worse, PASS or BELOW TARGET, with the most the
    window allows (its upper bound / the fixed run's utilisation).

    python bench/scheduler.py [--quick | --smoke] [--repeats 30] [--hours 24] [--load 1.05]
                              [--churn 8] [--sizes 1000,10000,100000] [--seed 1]
                              [--sim-nodes 25] [--quiet-wait 60] [--profile] [--json]
                              [--elastic 0.4] [--elastic-queued 0.15] [--elastic-sizes 10000]

``--quick`` makes 5 timed calls per queue size and simulates 6 hours instead of 24.
``--smoke`` checks that everything runs, in a few seconds: 2 calls at 1,000 and 10,000 queued
only (the elastic row at 1,000), no waiting for a quiet machine, a 2-hour day on 8 nodes; its
numbers mean nothing.
Seeded and deterministic apart from the timings. It is a benchmark, not a test: it exits 0
whatever the numbers and prints PASS or BELOW TARGET (it exits 1 only if the two paths ever
decide differently). ``--profile`` adds a cProfile of one decision of each path with 10,000
queued jobs (by own time; profiling inflates the cost of small function calls).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import psutil
from _machine import BUSY_PERCENT, log, wait_quiet
from _scheduler_day import part2, print_day
from _scheduler_elastic import part3, print_elastic
from _scheduler_mix import (
    CPUS_PER_NODE,
    DAY,
    GPUS_PER_NODE,
    MULTI_GPU_SHARE,
    NODES,
    TIERS,
    Users,
    cluster,
    demand,
    elastic_demand,
    make_users,
    multi_gpu,
    percentile,
    pick,
)

from trainhouse.core.cluster import Node, Placement
from trainhouse.scheduler.incremental import Scheduler
from trainhouse.scheduler.policy import QueuedJob, RunningJob, Snapshot, decide
from trainhouse.scheduler.resources import Demand
from trainhouse.scheduler.simulate import DEFAULT_RESIZE_INTERVAL as RESIZE_INTERVAL

# queue size -> target for the incremental path's median, ms
TARGETS_MS: dict[int, float] = {10_000: 50.0, 100_000: 500.0}
TICK = 30.0  # seconds between two snapshots
RUNNING_ELASTIC = 0.3  # in part 1's elastic rows, the share of multi-GPU running jobs elastic


# -- part 1: decision time -----------------------------------------------------------------


def queued_pool(
    rng: random.Random, users: Users, count: int, now: float, elastic: Elastic | None = None
) -> list[QueuedJob]:
    jobs = []
    for i in range(count):
        declares = rng.random() < 0.3
        d = demand(rng)
        if elastic is not None and multi_gpu(d) and elastic.rng.random() < elastic.queued:
            d = elastic_demand(elastic.rng, d)
        jobs.append(
            QueuedJob(
                id=1_000_000 + i,
                priority=pick(rng, TIERS),
                created_at=now - rng.uniform(0, 3 * DAY),
                demand=d,
                owner=rng.choices(users.names, users.weights)[0],
                max_runtime=rng.uniform(600, 12 * 3600) if declares else None,
            )
        )
    return jobs


@dataclass
class Elastic:
    """Which jobs of part 1's snapshots are elastic: ``queued`` and ``running`` are the shares
    of the multi-GPU jobs (a running one runs at a size drawn from its range), drawn from a
    stream of their own."""

    rng: random.Random
    queued: float
    running: float

    @classmethod
    def of(cls, seed: int, share: float) -> Elastic:
        """``share`` of all queued jobs elastic, and ``RUNNING_ELASTIC`` of the multi-GPU
        running ones."""
        rng = random.Random(seed * 1_000_003 + 1)
        return cls(rng, min(share / MULTI_GPU_SHARE, 1.0), RUNNING_ELASTIC)


def running_set(
    rng: random.Random,
    nodes: list[Node],
    users: Users,
    now: float,
    fill: float = 0.9,
    elastic: Elastic | None = None,
) -> tuple[RunningJob, ...]:
    """Running jobs on concrete, non-overlapping GPUs until ``fill`` of the GPUs are taken."""
    free_gpus = {n.name: [g.index for g in n.gpus] for n in nodes}
    free_cpus = {n.name: n.cpus for n in nodes}
    total = sum(len(n.gpus) for n in nodes)
    taken = 0
    out: list[RunningJob] = []
    misses = 0
    while taken < fill * total and misses < 200:
        d = demand(rng)
        flexible: Demand | None = None
        if elastic is not None and multi_gpu(d) and elastic.rng.random() < elastic.running:
            flexible = elastic_demand(elastic.rng, d)
            d = flexible.at(*elastic.rng.choice(flexible.sizes()))  # the size it runs at
        fits = [
            name
            for name in free_gpus
            if len(free_gpus[name]) >= d.gpus and free_cpus[name] >= d.cpus
        ]
        if len(fits) < d.nodes:
            misses += 1
            continue
        chosen = rng.sample(fits, d.nodes)
        placements = []
        for name in chosen:
            gpus = tuple(sorted(rng.sample(free_gpus[name], d.gpus)))
            free_gpus[name] = [g for g in free_gpus[name] if g not in gpus]
            free_cpus[name] -= d.cpus
            placements.append(Placement(name, d.cpus, gpus, d.procs))
        taken += d.nodes * d.gpus
        started = now - rng.uniform(60, 2 * DAY)
        every = rng.choice((600.0, 900.0, 1800.0))
        stopping = rng.random() < 0.02
        out.append(
            RunningJob(
                id=len(out) + 1,
                placements=tuple(placements),
                owner=rng.choices(users.names, users.weights)[0],
                priority=pick(
                    rng, [("low", 0.25), ("normal", 0.65), ("high", 0.08), ("urgent", 0.02)]
                ),
                started_at=started,
                # when declared, it has not run out yet
                max_runtime=(now - started) + rng.uniform(300, 12 * 3600)
                if rng.random() < 0.4
                else None,
                last_checkpoint_at=started + ((now - started) // every) * every,
                stopping=stopping,
                stop_deadline=now + rng.uniform(10, 120) if stopping else None,
                demand=flexible,
                resize_interval=RESIZE_INTERVAL if flexible is not None else 0.0,
            )
        )
    return tuple(out)


def snapshots(
    seed: int, queued: int, count: int, churn: int = 8, elastic: float = 0.0
) -> list[Snapshot]:
    """``count`` consecutive snapshots of the 25 x 8 cluster with ``queued`` jobs waiting
    (``elastic`` of them elastic, and as much of the multi-GPU running jobs)."""
    rng = random.Random(seed)
    flexible = Elastic.of(seed, elastic) if elastic else None
    nodes = cluster()
    users = make_users(rng)
    base_now = 30 * DAY
    pool = queued_pool(rng, users, queued + churn * count, base_now, flexible)
    queue, arriving = pool[:queued], iter(pool[queued:])
    usage = dict(users.usage)
    out = []
    for i in range(count):
        now = base_now + TICK * i
        out.append(
            Snapshot(
                nodes=tuple(nodes),
                running=running_set(rng, nodes, users, now, elastic=flexible),
                queued=tuple(queue),
                now=now,
                usage=dict(usage),
                shares=users.shares,
                quotas=users.quotas,
            )
        )
        # to the next tick: `churn` jobs leave (started, canceled), as many arrive, a few
        # change priority, usage moves
        for _ in range(churn):
            k = rng.randrange(len(queue))
            queue[k] = queue[-1]
            queue.pop()
            queue.append(replace(next(arriving), created_at=now + rng.uniform(0, TICK)))
        for _ in range(len(queue) // 1000):
            k = rng.randrange(len(queue))
            queue[k] = replace(queue[k], priority=pick(rng, TIERS))
        usage = {u: v * rng.uniform(0.95, 1.05) for u, v in usage.items()}
    return out


@dataclass
class Timed:
    wall: list[float]  # seconds of each call, perf_counter
    cpu: list[float]  # CPU seconds of this process in each call, process_time


def summary(timed: Timed) -> dict[str, float]:
    ms = [t * 1000 for t in timed.wall]
    return {
        "calls": len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 99),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "median_cpu_ms": statistics.median(timed.cpu) * 1000,
    }


def busy_cpu_seconds() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def time_both(snaps: list[Snapshot]) -> dict[str, Any]:
    """Both paths on every snapshot (the incremental one in sequence), and their outcome."""
    decide(snaps[0])  # warm-up, not timed
    scheduler = Scheduler()
    gc.collect()
    t0 = time.perf_counter()
    first = scheduler.decide(snaps[0])  # builds the index
    build = time.perf_counter() - t0
    if first != decide(snaps[0]):
        raise SystemExit("the incremental path decided differently from decide(); a bug")
    me = psutil.Process()
    ref, inc = Timed([], []), Timed([], [])
    outcome: dict[str, float] = defaultdict(float)
    own0, all0, t_start = sum(me.cpu_times()[:2]), busy_cpu_seconds(), time.perf_counter()
    for snap in snaps[1:]:
        results = []
        for timed, call in ((ref, decide), (inc, scheduler.decide)):
            gc.collect()
            c0, w0 = time.process_time(), time.perf_counter()
            results.append(call(snap))
            timed.wall.append(time.perf_counter() - w0)
            timed.cpu.append(time.process_time() - c0)
        if results[0] != results[1]:
            raise SystemExit("the incremental path decided differently from decide(); a bug")
        d, n = results[0], len(snaps) - 1
        outcome["starts"] += len(d.starts) / n
        outcome["preemptions"] += len(d.preemptions) / n
        outcome["resizes"] += len(d.resizes) / n
        outcome["waiting"] += len(d.waiting) / n
        outcome["running"] += len(snap.running) / n
        outcome["busy_gpus"] += sum(len(p.gpus) for r in snap.running for p in r.placements) / n
    span = time.perf_counter() - t_start
    others = busy_cpu_seconds() - all0 - (sum(me.cpu_times()[:2]) - own0)
    return {
        "reference": summary(ref),
        "incremental": summary(inc),
        "index_build_ms": build * 1000,
        "mean_outcome": dict(outcome),
        "others_cpu_percent": max(100 * others / (span * (psutil.cpu_count() or 1)), 0.0),
    }


def profile(snap: Snapshot, call: Any) -> str:
    call(snap)
    prof = cProfile.Profile()
    prof.enable()
    call(snap)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    return out.getvalue()


def elastic_counts(snaps: list[Snapshot]) -> dict[str, float]:
    """How many elastic jobs the snapshots hold, on average."""
    n = len(snaps)
    queued = sum(sum(1 for j in s.queued if j.demand.elastic) for s in snaps) / n
    running = [r for s in snaps for r in s.running if r.demand is not None]
    below = [r for r in running if r.demand and sum(p.procs for p in r.placements) < r.demand.world]
    return {
        "queued": queued,
        "queued_share": queued / max(statistics.fmean(len(s.queued) for s in snaps), 1),
        "running": len(running) / n,
        "running_below_most": len(below) / n,
    }


def part1(args: argparse.Namespace) -> dict[str, Any]:
    sizes: dict[str, Any] = {}
    busy_before = wait_quiet(args.quiet_wait)
    rows = [(queued, 0.0) for queued in args.sizes]
    rows += [(queued, args.elastic_queued) for queued in args.elastic_sizes]
    for queued, elastic in rows:
        label = f"{queued} ({elastic:.0%} elastic)" if elastic else str(queued)
        log(f"part 1: building {args.repeats + 1} snapshots with {label} queued jobs ...")
        snaps = snapshots(args.seed, queued, args.repeats + 1, args.churn, elastic)
        log("part 1: timing both paths on them ...")
        row = {"queued": queued, "label": label, **time_both(snaps)}
        if elastic:
            row["elastic"] = elastic_counts(snaps)
        target = TARGETS_MS.get(queued)
        if target is not None:
            median = row["incremental"]["median_ms"]
            row.update(target_ms=target, over_target=median / target, met=median < target)
        sizes[f"{queued}-elastic" if elastic else str(queued)] = row
    result: dict[str, Any] = {
        "cluster": f"{NODES} nodes x {GPUS_PER_NODE} GPUs, {CPUS_PER_NODE} CPU cores each",
        "churn": args.churn,
        "sizes": sizes,
        "busy_before_percent": busy_before,
        "busy": max(busy_before, *(r["others_cpu_percent"] for r in sizes.values())) > BUSY_PERCENT,
    }
    if args.profile:
        snaps = snapshots(args.seed, 10_000, 2, args.churn)
        scheduler = Scheduler()
        scheduler.decide(snaps[0])
        result["profile"] = {
            "decide": profile(snaps[1], decide),
            "incremental": profile(snaps[1], scheduler.decide),
        }
    return result


# -- report --------------------------------------------------------------------------------


def print_decisions(p1: dict[str, Any]) -> None:
    print(f"Part 1: one scheduling decision, {p1['cluster']}; {p1['churn']} jobs in/out per tick")
    print(
        f"{'queued':>18}{'path':>13}{'calls':>7}{'median ms':>11}{'p99 ms':>9}{'min ms':>9}"
        f"{'max ms':>9}{'median CPU ms':>15}{'others CPU %':>14}"
    )
    for row in p1["sizes"].values():
        for path in ("reference", "incremental"):
            t = row[path]
            print(
                f"{row['label']:>18}{path:>13}{t['calls']:>7}{t['median_ms']:>11.1f}"
                f"{t['p99_ms']:>9.1f}{t['min_ms']:>9.1f}{t['max_ms']:>9.1f}"
                f"{t['median_cpu_ms']:>15.1f}{row['others_cpu_percent']:>14.0f}"
            )
    for row in p1["sizes"].values():
        o = row["mean_outcome"]
        print(
            f"  {row['label']} queued, per decision on average: {o['running']:.0f} running jobs "
            f"on {o['busy_gpus']:.0f} GPUs; {o['starts']:.1f} starts, "
            f"{o['preemptions']:.1f} preemptions, {o['resizes']:.2f} resizes, "
            f"{o['waiting']:.0f} keep waiting; the incremental path's first call (building its "
            f"index) took {row['index_build_ms']:.0f} ms"
        )
        if "elastic" in row:
            e = row["elastic"]
            print(
                f"    elastic: {e['queued']:.0f} of the queued jobs ({e['queued_share']:.1%}), "
                f"{e['running']:.0f} of the running ones ({e['running_below_most']:.0f} below "
                "their largest size), per snapshot on average"
            )
    print("both paths made the same decisions on every snapshot")
    if p1["busy"]:
        print(
            f"warning: other processes used > {BUSY_PERCENT:.0f}% of the CPUs before or during "
            "the timed calls; the times are inflated and noisy, rerun on a quiet machine"
        )
    for row in p1["sizes"].values():
        if "target_ms" in row:
            verdict = "PASS" if row["met"] else "BELOW TARGET"
            inc = row["incremental"]
            print(
                f"{row['label']:>7} queued: incremental median / target = "
                f"{inc['median_ms']:.1f} ms / {row['target_ms']:.0f} ms = "
                f"{row['over_target']:.2f}: {verdict} (its CPU time: "
                f"{inc['median_cpu_ms']:.1f} ms = {inc['median_cpu_ms'] / row['target_ms']:.2f}"
                f"; the reference's median {row['reference']['median_ms']:.1f} ms = "
                f"{row['reference']['median_ms'] / row['target_ms']:.2f})"
            )
    for name, text in p1.get("profile", {}).items():
        print()
        print(f"cProfile of one {name} decision with 10,000 queued jobs (by own time):")
        print(text.rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Scheduling decision time on 25 x 8 GPUs, and a simulated day's utilisation."
    )
    parser.add_argument("--quick", action="store_true", help="5 calls per size and a 6 h day")
    parser.add_argument("--smoke", action="store_true", help="runs at all, in a few seconds")
    parser.add_argument("--repeats", type=int, help="timed calls per size and path (30)")
    parser.add_argument("--hours", type=float, help="length of the simulated day (24)")
    parser.add_argument("--load", type=float, default=1.05, help="demand / capacity (1.05)")
    parser.add_argument("--churn", type=int, default=8, help="jobs in and out per tick (8)")
    parser.add_argument("--sizes", help="queue sizes to time, comma-separated (1000,10000,100000)")
    parser.add_argument("--sim-nodes", type=int, help="nodes in parts 2 and 3 (25)")
    parser.add_argument(
        "--elastic", type=float, default=0.4, help="share of multi-GPU jobs elastic, part 3 (0.4)"
    )
    parser.add_argument(
        "--elastic-queued",
        type=float,
        default=0.15,
        help="share of the queued jobs elastic in part 1's elastic rows (0.15)",
    )
    parser.add_argument(
        "--elastic-sizes", help="queue sizes of part 1's rows with elastic jobs (10000)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (1)")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        help="seconds to wait before part 1 for other processes to leave the CPUs (60)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one decision")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.smoke else 5 if args.quick else 30
    if args.hours is None:
        args.hours = 2.0 if args.smoke else 6.0 if args.quick else 24.0
    if args.sim_nodes is None:
        args.sim_nodes = 8 if args.smoke else NODES
    if args.quiet_wait is None:
        args.quiet_wait = 0.0 if args.smoke else 60.0
    if args.sizes is None:
        args.sizes = "1000,10000" if args.smoke else "1000,10000,100000"
    args.sizes = [int(n) for n in args.sizes.split(",")]
    if args.elastic_sizes is None:
        args.elastic_sizes = "1000" if args.smoke else "10000"
    args.elastic_sizes = [int(n) for n in args.elastic_sizes.split(",") if n]
    if not 0 <= args.elastic <= 1 or not 0 <= args.elastic_queued <= MULTI_GPU_SHARE:
        parser.error(
            f"--elastic must be in [0, 1], --elastic-queued in [0, {MULTI_GPU_SHARE:.2f}] "
            "(the multi-GPU share of the mix)"
        )
    if args.repeats < 1 or args.hours <= 0 or args.sim_nodes < 4 or args.churn < 0:
        parser.error("--repeats must be >= 1, --hours > 0, --sim-nodes >= 4, --churn >= 0")
    if not args.sizes or min(args.sizes) < 1:
        parser.error("--sizes must be queue sizes >= 1")
    summary = {
        "seed": args.seed,
        "decision": part1(args),
        "day": part2(args),
        "elastic": part3(args),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_decisions(summary["decision"])
        print()
        print_day(summary["day"])
        print()
        print_elastic(summary["elastic"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
