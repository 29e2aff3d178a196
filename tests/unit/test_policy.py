from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainhouse.scheduler.policy import QueuedJob, RunningJob, Snapshot, decide, order
from trainhouse.scheduler.resources import Gpu, Node, Placement, never_fits
from trainhouse.spec import PRIORITY_TIERS, Resources


def node(cpus: int = 8, gpus: int = 0, name: str = "a") -> Node:
    return Node(name, cpus, 1 << 34, tuple(Gpu(i) for i in range(gpus)))


def job(i: int, procs: int = 1, gpus: int = 0, prio: str = "normal", t: float = 0.0) -> QueuedJob:
    res = Resources(procs_per_node=procs, gpus_per_node=gpus)
    return QueuedJob(i, prio, t or float(i), res)


def test_fifo_within_tier_and_priority_first() -> None:
    queued = (job(1, t=1), job(2, prio="high", t=2), job(3, t=3), job(4, prio="low", t=0))
    assert [j.id for j in order(queued)] == [2, 1, 3, 4]


def test_starts_what_fits_with_concrete_gpus() -> None:
    snap = Snapshot((node(8, 4),), (), (job(1, procs=2, gpus=2), job(2, procs=2, gpus=2)))
    d = decide(snap)
    placed = dict(d.starts)
    assert placed[1][0].gpus == (0, 1)
    assert placed[2][0].gpus == (2, 3)
    assert not d.waiting


def test_head_of_line_blocks_and_explains() -> None:
    running = (RunningJob(9, (Placement("a", 6, (), 6),)),)
    snap = Snapshot((node(8),), running, (job(1, procs=4), job(2, procs=1)))
    d = decide(snap)
    assert d.starts == []
    assert "needs 4 CPU cores on one node" in d.waiting[1]
    assert "2 CPU cores free on a" in d.waiting[1]
    assert "waiting behind job 1" in d.waiting[2]


def test_never_fits_says_what_machine_has() -> None:
    n = [node(2, 0)]
    assert never_fits(n, Resources(procs_per_node=2)) is None
    msg = never_fits(n, Resources(procs_per_node=4))
    assert msg is not None and "2 CPU cores" in msg and "4 CPU cores" in msg
    msg = never_fits(n, Resources(gpus_per_node=1))
    assert msg is not None and "no GPUs" in msg
    msg = never_fits(n, Resources(nodes=2))
    assert msg is not None and "Ray" in msg


jobs_strategy = st.lists(
    st.tuples(
        st.integers(1, 4),  # procs
        st.integers(0, 4),  # gpus
        st.sampled_from(PRIORITY_TIERS),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(cpus=st.integers(1, 16), gpus=st.integers(0, 8), specs=jobs_strategy)
def test_never_over_allocates_and_gangs_are_whole(cpus: int, gpus: int, specs: list) -> None:
    queued = tuple(job(i + 1, p, g, prio) for i, (p, g, prio) in enumerate(specs))
    snap = Snapshot((node(cpus, gpus),), (), queued)
    d = decide(snap)
    used_cpus = sum(p.cpus for _, ps in d.starts for p in ps)
    used_gpus = [g for _, ps in d.starts for p in ps for g in p.gpus]
    assert used_cpus <= cpus
    assert len(used_gpus) == len(set(used_gpus))  # no GPU handed out twice
    assert all(0 <= g < gpus for g in used_gpus)
    by_id = {j.id: j for j in queued}
    for job_id, ps in d.starts:
        res = by_id[job_id].resources
        assert len(ps) == res.nodes
        assert all(len(p.gpus) == res.gpus_per_node and p.cpus == res.cpus_per_node for p in ps)
    # every job either starts or has a reason, never both
    started = {j for j, _ in d.starts}
    assert started.isdisjoint(d.waiting)
    assert started | set(d.waiting) == set(by_id)
    # strict order: nothing starts after the first job that had to wait
    ordered = [j.id for j in order(queued)]
    if d.waiting:
        first_wait = min(ordered.index(j) for j in d.waiting)
        assert all(ordered.index(j) < first_wait for j in started)
