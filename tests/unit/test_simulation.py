"""Long-run properties of the policy, checked by simulating a cluster event by event."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainhouse.core.cluster import Gpu, Node
from trainhouse.scheduler.resources import Demand
from trainhouse.scheduler.simulate import SimJob, fifo_decide, simulate
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
