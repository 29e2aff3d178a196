"""The scheduling policy, a pure function: unit cases and hypothesis properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainhouse.core.cluster import Gpu, Node, Placement
from trainhouse.scheduler.policy import (
    QueuedJob,
    Quota,
    RunningJob,
    Snapshot,
    decide,
    order,
)
from trainhouse.scheduler.resources import Demand, never_fits
from trainhouse.spec import PRIORITY_TIERS, Resources


def node(cpus: int = 8, gpus: int = 0, name: str = "a") -> Node:
    return Node(name, cpus, 1 << 34, tuple(Gpu(i) for i in range(gpus)))


def job(
    i: int,
    procs: int = 1,
    gpus: int = 0,
    prio: str = "normal",
    t: float = 0.0,
    owner: str = "u",
    nodes: int = 1,
    runtime: float | None = None,
) -> QueuedJob:
    return QueuedJob(i, prio, t or float(i), Demand(nodes, procs, gpus, procs), owner, runtime)


def running(
    i: int,
    node_name: str = "a",
    cpus: int = 1,
    gpus: tuple[int, ...] = (),
    prio: str = "normal",
    owner: str = "u",
    started: float = 0.0,
    runtime: float | None = None,
    ckpt: float | None = None,
    stopping: bool = False,
) -> RunningJob:
    return RunningJob(
        i,
        (Placement(node_name, cpus, gpus, cpus),),
        owner,
        prio,
        started,
        runtime,
        ckpt,
        stopping,
        0.0 if stopping else None,
    )


def test_tier_then_age() -> None:
    snap = Snapshot(
        (node(),),
        (),
        (job(1, t=1), job(2, prio="high", t=2), job(3, t=3), job(4, prio="low", t=0.5)),
    )
    assert [j.id for j in order(snap)] == [2, 1, 3, 4]


def test_fair_share_interleaves_users_and_favours_the_light_user() -> None:
    queued = tuple(job(i, owner="heavy", t=i) for i in range(1, 5)) + tuple(
        job(10 + i, owner="light", t=10 + i) for i in range(1, 5)
    )
    ids = [j.id for j in order(Snapshot((node(),), (), queued))]
    assert ids[:2] in ([1, 11], [11, 1])
    assert ids[0::2] == [1, 2, 3, 4] or ids[1::2] == [1, 2, 3, 4]  # alternating users
    used = Snapshot((node(),), (), queued, usage={"heavy": 1e6})
    assert [j.id for j in order(used)][:4] == [11, 12, 13, 14]
    shared = Snapshot(
        (node(),), (), queued, usage={"heavy": 10.0, "light": 10.0}, shares={"heavy": 100.0}
    )
    assert next(j.id for j in order(shared)) == 1


def test_starts_what_fits_with_concrete_gpus() -> None:
    d = decide(Snapshot((node(8, 4),), (), (job(1, procs=2, gpus=2), job(2, procs=2, gpus=2))))
    placed = dict(d.starts)
    assert sorted([placed[1][0].gpus, placed[2][0].gpus]) == [(0, 1), (2, 3)]
    assert not d.waiting and not d.preemptions


def test_gang_spreads_one_member_per_node() -> None:
    nodes = (node(4, 2, "a"), node(4, 2, "b"), node(4, 2, "c"))
    d = decide(Snapshot(nodes, (), (job(1, procs=2, gpus=2, nodes=3),)))
    ((_, placements),) = d.starts
    assert sorted(p.node for p in placements) == ["a", "b", "c"]
    busy = (running(9, "c", cpus=1, gpus=(0,)),)
    d = decide(Snapshot(nodes, busy, (job(1, procs=2, gpus=2, nodes=3),)))
    assert d.starts == [] and "needs 2 GPU(s) and 2 CPU cores on each of 3 nodes" in d.waiting[1]


def test_first_blocked_job_gets_a_reservation_and_explanation() -> None:
    busy = (running(9, cpus=6, runtime=600, started=0.0),)
    d = decide(Snapshot((node(8),), busy, (job(1, procs=4), job(2, procs=4)), now=100.0))
    assert d.starts == []
    assert "needs 4 CPU cores on one node" in d.waiting[1]
    assert "largest free block: 2 CPU cores on a" in d.waiting[1]
    assert "reserved to start on a in about 8 min" in d.waiting[1]
    assert "job 1 is reserved to start first" in d.waiting[2]


def test_backfill_only_when_it_cannot_delay_the_head() -> None:
    busy = (running(9, cpus=6, runtime=600, started=0.0),)  # ends at t=600
    # job 1 needs the whole node; 2 cores are free until then
    queued = (job(1, procs=8), job(3, procs=2, t=2.0), job(2, procs=2, runtime=300, t=3.0))
    d = decide(Snapshot((node(8),), busy, queued, now=100.0))
    assert [s for s, _ in d.starts] == [2]  # ends at 400 < 600: cannot delay job 1
    assert "would delay the reserved start of job 1" in d.waiting[3]
    assert "max_runtime" in d.waiting[3]
    # with room to spare on the reserved node at t=600, a job without max_runtime may run too
    queued = (job(1, procs=4), job(3, procs=2))
    d = decide(Snapshot((node(8),), busy, queued, now=100.0))
    assert [s for s, _ in d.starts] == [3]


def test_unknown_end_blocks_backfill_into_the_reserved_room() -> None:
    busy = (running(9, cpus=6),)  # no max_runtime: may run forever
    queued = (job(1, procs=8), job(2, procs=2, runtime=10))
    d = decide(Snapshot((node(8),), busy, queued, now=5.0))
    assert d.starts == []  # job 9 may end any moment: its room is job 1's, even for 10 s
    assert "when running jobs end" in d.waiting[1]


def test_quota_waits_without_blocking_others() -> None:
    busy = (running(9, cpus=2, gpus=(0, 1), owner="alice"),)
    queued = (
        job(1, procs=2, gpus=2, owner="alice", t=1),
        job(2, procs=2, gpus=2, owner="bob", t=2),
    )
    snap = Snapshot((node(16, 8),), busy, queued, quotas={"alice": Quota(gpus=2)})
    d = decide(snap)
    assert [s for s, _ in d.starts] == [2]
    assert "quota: alice uses 2 of 2 GPUs; this job needs 2 more" in d.waiting[1]
    d = decide(Snapshot((node(16, 8),), busy, queued, default_quota=Quota(cpus=3)))
    assert "quota: alice uses 2 of 3 CPU cores" in d.waiting[1]


def test_preempts_lower_tier_losing_least_work() -> None:
    busy = (
        running(7, cpus=2, gpus=(0, 1), prio="low", started=0, ckpt=90),  # 10 s at risk
        running(8, cpus=2, gpus=(2, 3), prio="low", started=0, ckpt=10),  # 90 s at risk
    )
    d = decide(Snapshot((node(8, 4),), busy, (job(1, procs=2, gpus=2, prio="high"),), now=100.0))
    assert [(p.victim, p.for_job) for p in d.preemptions] == [(7, 1)]
    assert "preempting lower-priority job(s) 7" in d.waiting[1]
    # while job 7 stops, nobody else is preempted for job 1
    stopping = (running(7, cpus=2, gpus=(0, 1), prio="low", stopping=True), busy[1])
    d = decide(
        Snapshot((node(8, 4),), stopping, (job(1, procs=2, gpus=2, prio="high"),), now=101.0)
    )
    assert d.preemptions == [] and "waiting for job(s) 7 to stop" in d.waiting[1]


def test_never_preempts_same_or_higher_tier() -> None:
    busy = (running(7, cpus=2, gpus=(0, 1), prio="high"),)
    for prio in ("low", "normal", "high"):
        d = decide(Snapshot((node(8, 2),), busy, (job(1, procs=2, gpus=2, prio=prio),)))
        assert d.preemptions == []
    d = decide(Snapshot((node(8, 2),), busy, (job(1, procs=2, gpus=2, prio="urgent"),)))
    assert [p.victim for p in d.preemptions] == [7]


def test_preempts_as_few_as_possible() -> None:
    busy = (
        running(5, cpus=1, gpus=(0,), prio="low", ckpt=0),
        running(6, cpus=1, gpus=(1,), prio="low", ckpt=0),
        running(7, cpus=2, gpus=(2, 3), prio="low", ckpt=50),
    )
    d = decide(Snapshot((node(8, 4),), busy, (job(1, procs=2, gpus=2, prio="high"),), now=60))
    # one victim holding 2 GPUs beats two victims, even though it checkpointed earlier
    assert sorted(p.victim for p in d.preemptions) in ([5, 6], [7])
    assert len(d.preemptions) == 1


def test_never_fits_says_what_machine_has() -> None:
    n = [node(2, 0)]
    assert never_fits(n, Resources(procs_per_node=2)) is None
    msg = never_fits(n, Resources(procs_per_node=4))
    assert msg is not None and "2 CPU cores" in msg and "4 CPU cores" in msg
    msg = never_fits(n, Resources(gpus_per_node=1))
    assert msg is not None and "no GPUs" in msg
    msg = never_fits(n, Resources(nodes=2))
    assert msg is not None and "Ray" in msg


# -- properties ------------------------------------------------------------------------------

jobs_strategy = st.lists(
    st.tuples(
        st.integers(1, 4),  # procs (= CPU cores) per node
        st.integers(0, 4),  # gpus per node
        st.integers(1, 2),  # nodes
        st.sampled_from(PRIORITY_TIERS),
        st.sampled_from(["ann", "bob", "cy"]),
        st.one_of(st.none(), st.integers(10, 1000)),  # max_runtime
    ),
    max_size=14,
)
running_strategy = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.integers(1, 3),
        st.integers(0, 2),
        st.sampled_from(PRIORITY_TIERS),
        st.booleans(),
    ),
    max_size=5,
)


def cluster(n: int, cpus: int, gpus: int) -> tuple[Node, ...]:
    return tuple(node(cpus, gpus, f"n{i}") for i in range(n))


def place_running(nodes: tuple[Node, ...], specs: list) -> tuple[RunningJob, ...]:
    free = {n.name: [n.cpus, list(range(len(n.gpus)))] for n in nodes}
    out = []
    for i, (ni, cpus, gpus, prio, stopping) in enumerate(specs):
        name = nodes[ni % len(nodes)].name
        if free[name][0] < cpus or len(free[name][1]) < gpus:
            continue
        taken = tuple(free[name][1][:gpus])
        free[name][1] = free[name][1][gpus:]
        free[name][0] -= cpus
        out.append(
            running(100 + i, name, cpus, taken, prio, started=0.0, ckpt=float(i), stopping=stopping)
        )
    return tuple(out)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 3),
    cpus=st.integers(1, 12),
    gpus=st.integers(0, 6),
    specs=jobs_strategy,
    busy=running_strategy,
    quota=st.one_of(st.none(), st.integers(0, 6)),
)
def test_policy_invariants(
    n: int, cpus: int, gpus: int, specs: list, busy: list, quota: int | None
) -> None:
    nodes = cluster(n, cpus, gpus)
    run = place_running(nodes, busy)
    queued = tuple(
        job(i + 1, p, g, prio, owner=o, nodes=k, runtime=rt)
        for i, (p, g, k, prio, o, rt) in enumerate(specs)
    )
    snap = Snapshot(nodes, run, queued, now=50.0, default_quota=Quota(gpus=quota))
    d = decide(snap)
    by_id = {j.id: j for j in queued}
    # never over-allocate: nothing handed out twice, nothing beyond what is free
    for nd in nodes:
        held = [p for r in run for p in r.placements if p.node == nd.name]
        new = [p for _, ps in d.starts for p in ps if p.node == nd.name]
        all_gpus = [g for p in held + new for g in p.gpus]
        assert len(all_gpus) == len(set(all_gpus))
        assert all(0 <= g < gpus for g in all_gpus)
        assert sum(p.cpus for p in held + new) <= cpus
    for job_id, ps in d.starts:
        dm = by_id[job_id].demand
        assert len(ps) == dm.nodes and len({p.node for p in ps}) == dm.nodes  # whole gang
        assert all(len(p.gpus) == dm.gpus and p.cpus == dm.cpus for p in ps)
    started = {j for j, _ in d.starts}
    assert started.isdisjoint(d.waiting)
    assert started | set(d.waiting) == set(by_id)  # every job starts or says why not
    assert all(reason.strip() for reason in d.waiting.values())
    # quotas hold for what starts now
    if quota is not None:
        for owner in {j.owner for j in queued}:
            new_gpus = sum(
                by_id[j].demand.gpus * by_id[j].demand.nodes
                for j in started
                if by_id[j].owner == owner
            )
            held = sum(r.gpus for r in run if r.owner == owner)
            assert new_gpus == 0 or held + new_gpus <= quota
    # preemption: strictly lower tiers, never a job already stopping, each victim once
    tiers = {r.id: PRIORITY_TIERS.index(r.priority) for r in run}
    stopping = {r.id for r in run if r.stopping}
    victims = [p.victim for p in d.preemptions]
    assert len(victims) == len(set(victims))
    for p in d.preemptions:
        assert p.victim not in stopping
        assert tiers[p.victim] < PRIORITY_TIERS.index(by_id[p.for_job].priority)
    assert {p.for_job for p in d.preemptions} <= set(d.waiting)
