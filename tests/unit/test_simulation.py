"""Long-run properties of the policy, checked by simulating a cluster event by event."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainhouse.core.cluster import Gpu, Node
from trainhouse.scheduler.resources import Demand
from trainhouse.scheduler.simulate import SimJob, SimResult, fifo_decide, simulate
from trainhouse.spec import PRIORITY_TIERS


def gpu_cluster(n: int, gpus: int, cpus: int = 32) -> list[Node]:
    return [Node(f"n{i}", cpus, 1 << 36, tuple(Gpu(g) for g in range(gpus))) for i in range(n)]


job_strategy = st.tuples(
    st.integers(0, 3),  # owner
    st.sampled_from(PRIORITY_TIERS),
    st.integers(0, 20_000),  # submit time
    st.integers(1, 2),  # nodes
    st.integers(0, 4),  # gpus per node
    st.integers(60, 20_000),  # runtime
    st.booleans(),  # declares max_runtime
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), gpus=st.integers(1, 4), specs=st.lists(job_strategy, max_size=25))
def test_every_job_that_fits_eventually_runs_and_preemption_never_cycles(
    n: int, gpus: int, specs: list
) -> None:
    nodes = gpu_cluster(n, gpus)
    jobs = [
        SimJob(
            i,
            f"u{o}",
            prio,
            float(t),
            Demand(k, 1, g, 1),
            float(rt),
            float(rt) if declares else None,
            checkpoint_every=300.0,
        )
        for i, (o, prio, t, k, g, rt, declares) in enumerate(specs)
        if k <= n and g <= gpus  # fits the cluster
    ]
    result = simulate(nodes, jobs)
    assert result.unfinished == []
    tier = {j.id: PRIORITY_TIERS.index(j.priority) for j in jobs}
    pairs = set()
    for victim, by in result.preemptions:
        assert tier[victim] < tier[by]  # never by its own tier or a lower one
        assert (by, victim) not in pairs  # no cycle
        pairs.add((victim, by))
    assert len(result.preemptions) <= len(jobs) * len(PRIORITY_TIERS)


@settings(max_examples=25, deadline=None)
@given(
    gpus=st.integers(2, 8),
    job_gpus=st.integers(1, 2),
    runtime=st.integers(600, 7200),
    head_start=st.integers(0, 4),
)
def test_equal_demand_gets_equal_gpu_hours(
    gpus: int, job_gpus: int, runtime: int, head_start: int
) -> None:
    nodes = gpu_cluster(1, gpus)
    jobs = []
    for owner in ("ann", "bob"):
        for k in range(60):
            # ann's whole backlog is submitted first: FIFO would give her everything
            submit = float(k if owner == "ann" else 60 + head_start + k)
            jobs.append(
                SimJob(
                    len(jobs), owner, "normal", submit, Demand(1, 1, job_gpus, 1), float(runtime)
                )
            )
    horizon = 48 * 3600.0
    result = simulate(nodes, jobs, until=horizon)
    ann, bob = result.gpu_seconds["ann"], result.gpu_seconds["bob"]
    assert abs(ann - bob) <= 0.1 * max(ann, bob)


def test_fair_share_remembers_past_use() -> None:
    nodes = gpu_cluster(1, 2)
    # ann used the cluster alone all morning; in the afternoon both want everything
    jobs = [SimJob(i, "ann", "normal", 0.0, Demand(1, 1, 1, 1), 3600.0) for i in range(8)]
    jobs += [
        SimJob(100 + i, who, "normal", 4 * 3600.0 + i, Demand(1, 1, 1, 1), 3600.0)
        for i in range(20)
        for who in ("ann", "bob")
    ]
    result = simulate(nodes, jobs, until=10 * 3600.0)
    afternoon = {o: 0 for o in ("ann", "bob")}
    for job_id, start in result.started.items():
        if start >= 4 * 3600.0:
            afternoon[
                "bob" if any(j.id == job_id and j.owner == "bob" for j in jobs) else "ann"
            ] += 1
    assert afternoon["bob"] > afternoon["ann"]


def test_backfill_beats_fifo_utilisation() -> None:
    nodes = gpu_cluster(2, 4)
    jobs = []
    for k in range(30):
        big = k % 3 == 0
        jobs.append(
            SimJob(
                k,
                "ann",
                "normal",
                float(k * 60),
                Demand(1, 1, 4 if big else 1, 1),
                3600.0 if big else 900.0,
                3600.0 if big else 900.0,
            )
        )
    smart = simulate(nodes, jobs)
    fifo = simulate(nodes, jobs, policy=fifo_decide)
    assert smart.unfinished == [] and fifo.unfinished == []
    assert smart.makespan <= fifo.makespan
    assert smart.utilisation(8) >= fifo.utilisation(8)


def test_preempted_job_loses_at_most_its_checkpoint_interval() -> None:
    nodes = gpu_cluster(1, 2)
    jobs = [
        SimJob(1, "ann", "low", 0.0, Demand(1, 1, 2, 1), 7200.0, checkpoint_every=600.0),
        SimJob(2, "bob", "high", 1000.0, Demand(1, 1, 2, 1), 1800.0),
    ]
    result = simulate(nodes, jobs)
    assert result.preemptions == [(1, 2)]
    assert 0 < result.lost_seconds <= 600.0
    assert result.finished[2] == 1000.0 + 1800.0
    assert result.unfinished == []


def test_utilisation_over_a_window_counts_only_what_was_held_in_it() -> None:
    # one 8-GPU node; job 1 (4 GPUs) runs 0-100 s, job 2 (8 GPUs) arrives at 10 s and waits
    nodes = gpu_cluster(1, 8)
    jobs = [
        SimJob(1, "a", "normal", 0.0, Demand(1, 1, 4, 1), 100.0),
        SimJob(2, "b", "normal", 10.0, Demand(1, 1, 8, 1), 50.0),
    ]
    result = simulate(nodes, jobs, policy=fifo_decide, until=200.0)
    assert result.first_wait == 10.0  # the queue first stays non-empty when job 2 arrives
    assert sorted(result.segments) == [(0.0, 100.0, 4), (100.0, 150.0, 8)]
    assert sum(g * (b - a) for a, b, g in result.segments) == sum(result.gpu_seconds.values())
    assert result.utilisation_between(0.0, 100.0, 8) == 0.5
    assert result.utilisation_between(50.0, 150.0, 8) == (4 * 50 + 8 * 50) / 800
    assert result.utilisation_between(150.0, 200.0, 8) == 0.0
    assert result.utilisation_between(5.0, 5.0, 8) == 0.0


# -- elastic jobs --------------------------------------------------------------------------


def elastic(nodes: int, procs: int, least_nodes: int, least_procs: int, cpp: int = 1) -> Demand:
    """``least_nodes:nodes`` x ``least_procs:procs`` ranks of one GPU and ``cpp`` CPUs each."""
    return Demand(
        nodes,
        procs * cpp,
        procs,
        procs,
        min_nodes=least_nodes,
        min_procs=least_procs,
        cpus_per_proc=cpp,
        gpus_per_proc=1,
    )


def useful_rank_seconds(result: SimResult, job: int) -> float:
    """The work a job's attempts did: ranks x (time held - setup), summed."""
    return float(
        sum(a.ranks * (a.end - a.start - a.setup) for a in result.attempts if a.job == job)
    )


def test_a_shrunk_and_regrown_job_keeps_its_work_and_runs_at_its_size() -> None:
    # one node of 8 GPUs; job 1 (low, 2:8 ranks) runs at 8, for 3600 s of work at that size;
    # job 2 (high, 4 GPUs) arrives at 1000 s for 1000 s: job 1 shrinks to 4 (no work lost),
    # runs at half speed after a 60 s setup, and grows back to 8 when job 2 ends
    nodes = gpu_cluster(1, 8, cpus=48)
    jobs = [
        SimJob(1, "ann", "low", 0.0, elastic(1, 8, 1, 2), 3600.0, checkpoint_every=600.0),
        SimJob(2, "bob", "high", 1000.0, Demand(1, 4, 4, 4), 1000.0),
    ]
    result = simulate(nodes, jobs)
    assert result.preemptions == []
    assert result.resizes == [(1, (1, 8), (1, 4), 1000.0), (1, (1, 4), (1, 8), 2000.0)]
    assert result.started == {1: 0.0, 2: 1000.0}
    assert result.finished[2] == 2000.0
    # work: 8 x 1000 before the shrink, 4 x (1000 - 60) at 4, the rest at 8 after a setup
    left = 8 * 3600.0 - 8 * 1000.0 - 4 * 940.0
    assert result.finished[1] == pytest.approx(2000.0 + 60.0 + left / 8)
    assert useful_rank_seconds(result, 1) == pytest.approx(8 * 3600.0)
    assert result.setup_gpu_seconds == pytest.approx(4 * 60.0 + 8 * 60.0)
    assert [(a.start, a.ranks, a.setup) for a in result.attempts if a.job == 1] == [
        (0.0, 8, 0.0),
        (1000.0, 4, 60.0),
        (2000.0, 8, 60.0),
    ]
    assert result.unfinished == []


def test_an_elastic_job_starts_small_and_grows_after_its_resize_interval() -> None:
    # 2 GPUs are taken by job 1 until 1000 s; job 2 (2:4 ranks) starts at 2 and grows to 4
    # when job 1 ends, with no other event to wake the simulation
    nodes = gpu_cluster(1, 4, cpus=16)
    jobs = [
        SimJob(1, "ann", "normal", 0.0, Demand(1, 2, 2, 2), 1000.0),
        SimJob(2, "bob", "normal", 0.0, elastic(1, 4, 1, 2), 2000.0, resize_interval=1500.0),
    ]
    result = simulate(nodes, jobs)
    # job 1 goes first (lower id at the same age); job 2 starts at 2 ranks beside it; at 1000 s
    # it has run 1000 s (< 1500 s): it may grow only at 1500 s, an event of its own
    assert result.started == {1: 0.0, 2: 0.0}
    assert result.resizes == [(2, (1, 2), (1, 4), 1500.0)]
    left = 4 * 2000.0 - 2 * 1500.0
    assert result.finished[2] == pytest.approx(1500.0 + 60.0 + left / 4)
    assert useful_rank_seconds(result, 2) == pytest.approx(4 * 2000.0)


elastic_job_strategy = st.tuples(
    st.integers(0, 3),  # owner
    st.sampled_from(PRIORITY_TIERS),
    st.integers(0, 20_000),  # submit time
    st.integers(1, 2),  # nodes (the most)
    st.integers(1, 4),  # ranks per node (the most), a GPU each
    st.integers(60, 20_000),  # runtime at the largest size
    st.booleans(),  # elastic
    st.booleans(),  # declares max_runtime
    st.sampled_from((0.0, 300.0, 1200.0)),  # resize_interval
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), specs=st.lists(elastic_job_strategy, max_size=20))
def test_an_elastic_day_finishes_every_job_within_the_cluster_and_keeps_resized_work(
    n: int, specs: list[tuple[int, str, int, int, int, int, bool, bool, float]]
) -> None:
    gpus = 4
    nodes = gpu_cluster(n, gpus, cpus=8)
    jobs = []
    for i, (o, prio, t, k, p, rt, flexible, declares, interval) in enumerate(specs):
        if k > n:
            continue
        d = elastic(k, p, 1, 1) if flexible else Demand(k, p, p, p)
        # a declared max_runtime holds at any size (its least is 1 rank), setup included
        declared = float(rt) * d.world + 60.0 if flexible else float(rt)
        jobs.append(
            SimJob(
                i,
                f"u{o}",
                prio,
                float(t),
                d,
                float(rt),
                declared if declares else None,
                checkpoint_every=300.0,
                resize_interval=interval,
            )
        )
    result = simulate(nodes, jobs)
    assert result.unfinished == []
    preempted = {victim for victim, _ in result.preemptions}
    for job in jobs:
        need = job.runtime * job.demand.world
        done = useful_rank_seconds(result, job.id)
        if job.id in preempted:
            assert done >= need - 1e-6 * need  # work lost to a preemption is done again
        else:
            assert done == pytest.approx(need)  # resizes lose nothing
    # never more GPUs held than the cluster has
    events = sorted(
        [(a.start, a.gpus) for a in result.attempts] + [(a.end, -a.gpus) for a in result.attempts],
        key=lambda e: (e[0], e[1]),
    )
    held = 0
    for _, change in events:
        held += change
        assert held <= n * gpus
    resized = {job for job, *_ in result.resizes}
    assert resized <= {j.id for j in jobs if j.demand.elastic}


def test_a_fixed_day_has_no_resizes_and_every_uninterrupted_job_runs_its_runtime() -> None:
    nodes = gpu_cluster(2, 4)
    jobs = [
        SimJob(k, f"u{k % 3}", "normal", float(k * 90), Demand(1, 1, 1 + k % 4, 1), 600.0 + k)
        for k in range(30)
    ]
    result = simulate(nodes, jobs)
    assert result.unfinished == []
    assert result.resizes == [] and result.setup_gpu_seconds == 0.0
    for a in result.attempts:
        assert a.end - a.start == 600.0 + a.job  # rate 1, no setup: to the float
