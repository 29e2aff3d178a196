"""The cluster, users and job mix ``scheduler.py`` times decisions on and simulates a day with.

A plain-name helper module of the benchmarks (imported from their own directory, like
``_machine``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from trainhouse.core.cluster import Gpu, Node
from trainhouse.scheduler.policy import Quota
from trainhouse.scheduler.resources import Demand

NODES = 25
GPUS_PER_NODE = 8
CPUS_PER_NODE = 64
CPUS_PER_GPU = 6  # leaves a few cores per node for the node itself
USERS = 50
DAY = 86400.0

# (nodes, gpus per node) -> weight: single-node gangs of 1-8 GPUs, some 2-4 node gangs of 8
SIZES: list[tuple[tuple[int, int], float]] = [
    ((1, 1), 0.35),
    ((1, 2), 0.20),
    ((1, 4), 0.20),
    ((1, 8), 0.15),
    ((2, 8), 0.05),
    ((3, 8), 0.02),
    ((4, 8), 0.03),
]
# the share of the mix's jobs with more than one GPU
MULTI_GPU_SHARE = sum(w for (n, g), w in SIZES if n * g >= 2) / sum(w for _, w in SIZES)
TIERS: list[tuple[str, float]] = [("low", 0.12), ("normal", 0.78), ("high", 0.09), ("urgent", 0.01)]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between order statistics."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def pick(rng: random.Random, table: list[tuple[Any, float]]) -> Any:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


def demand(rng: random.Random) -> Demand:
    nodes, gpus = pick(rng, SIZES)
    return Demand(nodes, gpus * CPUS_PER_GPU, gpus, gpus)


def cluster(n: int = NODES, gpus: int = GPUS_PER_NODE, cpus: int = CPUS_PER_NODE) -> list[Node]:
    return [
        Node(f"node{i:02d}", cpus, 1 << 40, tuple(Gpu(g, "H100", 80 << 30) for g in range(gpus)))
        for i in range(n)
    ]


@dataclass
class Users:
    names: list[str]
    weights: list[float]  # how much each submits (Zipf-like: a few heavy users)
    usage: dict[str, float]  # decayed cluster-seconds
    shares: dict[str, float]
    quotas: dict[str, Quota]


def make_users(rng: random.Random) -> Users:
    names = [f"user{i:02d}" for i in range(USERS)]
    weights = [1.0 / (i + 1) ** 0.8 for i in range(USERS)]
    # decayed usage in cluster-seconds (1.0 = the whole cluster for a second): new users with
    # none, most with up to a few cluster-hours, a few heavy ones
    usage = {
        n: 0.0 if rng.random() < 0.1 else rng.lognormvariate(math.log(1800), 1.5) for n in names
    }
    shares = {n: 2.0 for n in rng.sample(names, 4)}
    quotas = {n: Quota(gpus=rng.choice((16, 32, 64))) for n in rng.sample(names, 5)}
    return Users(names, weights, usage, shares, quotas)


def elastic_demand(rng: random.Random, d: Demand) -> Demand:
    """``d`` (a multi-GPU job of the mix, at its largest) made elastic down to a quarter or a
    half of it: a one-node job in ranks per node (``procs_per_node: "2:8"``), a multi-node one
    in nodes (``nodes: "1:4"``), one GPU and ``CPUS_PER_GPU`` cores a rank."""
    part = rng.choice((0.25, 0.5))
    if d.nodes == 1:
        least_nodes, least_procs = 1, max(1, int(d.procs * part))
    else:
        least_nodes, least_procs = max(1, int(d.nodes * part)), d.procs
    return Demand(
        d.nodes,
        d.cpus,
        d.gpus,
        d.procs,
        min_nodes=least_nodes,
        min_procs=least_procs,
        cpus_per_proc=CPUS_PER_GPU,
        gpus_per_proc=1,
    )


def multi_gpu(d: Demand) -> bool:
    return bool(d.nodes * d.gpus >= 2)
