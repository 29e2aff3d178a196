"""Elastic jobs in the policy (``scheduler/elastic.py``): examples, then hypothesis properties.

The properties, on random clusters, queues and running jobs (fixed and elastic):
never below MIN or above MAX, all or nothing at every size (no node over-committed by the
starts and the growth of one decision), no growth inside ``resize_interval``, quotas counted at
the current size, a shrink only for a job of a higher tier, on a node that job can use, never
beside a preemption for the same job, and growth only when no job of higher or equal priority
waits for capacity.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainhouse.core.cluster import Gpu, Node, Placement
from trainhouse.core.errors import SpecError
from trainhouse.core.spec import tier_rank
from trainhouse.scheduler.elastic import current_size
from trainhouse.scheduler.policy import QueuedJob, Quota, RunningJob, Snapshot, decide
from trainhouse.scheduler.resources import Demand, never_fits
from trainhouse.spec import PRIORITY_TIERS, Resources, parse_spec

NOW = 100_000.0


def node(cpus: int = 8, gpus: int = 0, name: str = "a") -> Node:
    return Node(name, cpus, 1 << 34, tuple(Gpu(i) for i in range(gpus)))


def elastic(least: int, most: int, nodes: tuple[int, int] = (1, 1), gpu: bool = False) -> Demand:
    return Demand(
        nodes[1],
        most,
        most if gpu else 0,
        most,
        min_nodes=nodes[0],
        min_procs=least,
        cpus_per_proc=1,
        gpus_per_proc=1 if gpu else 0,
    )


def queued(i: int, demand: Demand, prio: str = "normal", owner: str = "u") -> QueuedJob:
    return QueuedJob(i, prio, float(i), demand, owner)


def fixed(i: int, cpus: int, prio: str = "normal", owner: str = "u") -> QueuedJob:
    return QueuedJob(i, prio, float(i), Demand(1, cpus, 0, cpus), owner)


def run_elastic(
    i: int,
    procs: int,
    demand: Demand,
    prio: str = "low",
    started: float = 0.0,
    interval: float = 300.0,
    owner: str = "u",
    where: str = "a",
) -> RunningJob:
    return RunningJob(
        i,
        (Placement(where, procs, (), procs),),
        owner,
        prio,
        started,
        demand=demand,
        resize_interval=interval,
    )


def run_fixed(i: int, cpus: int, prio: str = "normal", owner: str = "u") -> RunningJob:
    return RunningJob(i, (Placement("a", cpus, (), cpus),), owner, prio, 0.0)


def snap(
    nodes: tuple[Node, ...],
    running: tuple[RunningJob, ...] = (),
    queue: tuple[QueuedJob, ...] = (),
    **kw: object,
) -> Snapshot:
    return Snapshot(nodes, running, queue, now=NOW, **kw)  # type: ignore[arg-type]


# -- the spec -------------------------------------------------------------------------------


def test_the_spec_takes_min_max_sizes_and_a_plain_integer_stays_fixed() -> None:
    res = Resources(procs_per_node="2:8")
    assert res.elastic and res.procs_range == (2, 8) and res.procs == 8
    assert Resources(procs_per_node="4:4").procs_per_node == 4  # MIN == MAX: fixed
    assert not Resources(procs_per_node=4).elastic
    gpu = Resources(nodes="1:4", gpus_per_node="2:8")
    assert gpu.procs_per_node == "2:8" and gpu.gpus_per_proc == 1 and gpu.nodes_range == (1, 4)
    d = Demand.of(Resources(procs_per_node="2:8", cpus_per_proc=2))
    assert (d.nodes, d.cpus, d.procs, d.min_procs, d.cpus_per_proc) == (1, 16, 8, 2, 2)
    assert d.smallest() == Demand(1, 4, 0, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('resources: {procs_per_node: "8:2"}', r"MIN:MAX with 1 <= MIN <= MAX <= 1024"),
        ('resources: {procs_per_node: "0:2"}', r"MIN:MAX with 1 <= MIN"),
        ('resources: {procs_per_node: "two"}', r"whole number or MIN:MAX"),
        ('resources: {procs_per_node: "2:8", gpus_per_node: 4}', r"gives its range in gpus_per_"),
        ('resources: {gpus_per_node: "2:8", procs_per_node: "1:8"}', r"one rank per GPU"),
        ('resources: {nodes: "1:5000"}', r"MAX <= 4096"),
        ("resize_interval: -5", r"resize_interval"),
    ],
)
def test_bad_sizes_are_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(f"entrypoint: python train.py\n{text}\n")


def test_an_elastic_job_can_run_when_its_least_fits() -> None:
    nodes = [node(cpus=4)]
    assert never_fits(nodes, Resources(procs_per_node="2:8")) is None
    assert "needs 6 rank(s)" in (never_fits(nodes, Resources(procs_per_node="6:8")) or "")
    local = never_fits(nodes, Resources(nodes="1:2"))
    assert local is not None and "local executor" in local


# -- starting -------------------------------------------------------------------------------


def test_an_elastic_job_starts_at_the_largest_size_that_fits() -> None:
    d = decide(snap((node(8),), (run_fixed(9, 3),), (queued(1, elastic(2, 8)),)))
    ((job_id, placements),) = d.starts
    assert job_id == 1 and placements == (Placement("a", 5, (), 5),)


def test_an_elastic_job_does_not_start_larger_than_delays_a_reserved_job() -> None:
    # job 1 (high) needs all 8 CPUs and is reserved for when job 9 ends (in 100 s); the elastic
    # job, with no max_runtime, may only take what the reservation leaves: nothing but its
    # least would delay it, so it waits
    running = (RunningJob(9, (Placement("a", 2, (), 2),), "u", "normal", NOW - 10, 110.0),)
    d = decide(
        snap(
            (node(8),),
            running,
            (fixed(1, 8, prio="high"), queued(2, elastic(2, 6))),
            preemption=False,
        )
    )
    assert d.starts == []
    assert "would delay the reserved start of job 1" in d.waiting[2]


def test_an_elastic_job_stays_within_its_owners_quota() -> None:
    d = decide(snap((node(8),), (), (queued(1, elastic(2, 8)),), quotas={"u": Quota(cpus=5)}))
    assert d.starts[0][1] == (Placement("a", 5, (), 5),)


# -- shrinking ------------------------------------------------------------------------------


def test_a_higher_priority_job_shrinks_an_elastic_job_instead_of_preempting_it() -> None:
    d = decide(snap((node(8),), (run_elastic(5, 8, elastic(2, 8)),), (fixed(1, 3, "high"),)))
    assert d.preemptions == []
    (resize,) = d.resizes
    assert (resize.job, resize.old, resize.new, resize.for_job) == (5, (1, 8), (1, 5), 1)
    assert resize.reason == "shrunk 8->5: job 1 (high) needed 3 CPU cores"
    assert "shrinking lower-priority elastic job(s) 5 (8->5)" in d.waiting[1]


def test_a_shrink_in_the_interval_is_allowed_for_priority() -> None:
    young = run_elastic(5, 8, elastic(2, 8), started=NOW - 1, interval=10_000)
    d = decide(snap((node(8),), (young,), (fixed(1, 3, "high"),)))
    assert [r.new for r in d.resizes] == [(1, 5)]


def test_below_its_least_an_elastic_job_is_preempted_whole() -> None:
    d = decide(snap((node(8),), (run_elastic(5, 8, elastic(6, 8)),), (fixed(1, 4, "high"),)))
    assert d.resizes == []
    assert [p.victim for p in d.preemptions] == [5]


def test_equal_priority_never_shrinks_and_a_shrink_is_asked_once() -> None:
    same = decide(
        snap((node(8),), (run_elastic(5, 8, elastic(2, 8), prio="high"),), (fixed(1, 3, "high"),))
    )
    assert same.resizes == [] and same.preemptions == []
    stopping = RunningJob(
        5,
        (Placement("a", 8, (), 8),),
        "u",
        "low",
        0.0,
        stopping=True,
        stop_deadline=NOW,
        demand=elastic(2, 8),
    )
    again = decide(snap((node(8),), (stopping,), (fixed(1, 3, "high"),)))
    assert again.resizes == [] and "waiting for job(s) 5 to stop" in again.waiting[1]


# -- growing --------------------------------------------------------------------------------


def test_an_elastic_job_grows_into_freed_capacity_after_its_interval() -> None:
    d = decide(snap((node(8),), (run_elastic(5, 2, elastic(2, 8), interval=300),)))
    (resize,) = d.resizes
    assert (resize.old, resize.new) == ((1, 2), (1, 8))
    assert resize.reason == "grew 2->8: 6 CPU cores freed"
    young = run_elastic(5, 2, elastic(2, 8), started=NOW - 10, interval=300)
    assert decide(snap((node(8),), (young,))).resizes == []


def test_growth_waits_for_jobs_of_higher_or_equal_priority_but_not_lower() -> None:
    grower = run_elastic(5, 2, elastic(2, 8), prio="normal")
    blocker = run_fixed(9, 4, prio="urgent")  # leaves 2 CPUs free
    for prio, grows in (("high", False), ("normal", False), ("low", True)):
        waiting = fixed(1, 4, prio)  # does not fit in the 2 free CPUs
        d = decide(snap((node(8),), (grower, blocker), (waiting,), preemption=False))
        assert 1 in d.waiting
        assert bool(d.resizes) is grows, prio


def test_growth_respects_the_owners_quota() -> None:
    d = decide(snap((node(8),), (run_elastic(5, 2, elastic(2, 8)),), quotas={"u": Quota(cpus=4)}))
    assert [r.new for r in d.resizes] == [(1, 4)]


def test_a_multi_node_elastic_job_grows_onto_a_free_node() -> None:
    grower = run_elastic(5, 4, elastic(4, 4, nodes=(1, 3)))
    d = decide(snap((node(4, name="a"), node(4, name="b")), (grower,)))
    assert [(r.old, r.new) for r in d.resizes] == [((1, 4), (2, 4))]


# -- properties -----------------------------------------------------------------------------


@st.composite
def scenes(draw: st.DrawFn) -> Snapshot:
    count = draw(st.integers(1, 3))
    cpus = draw(st.sampled_from((4, 8, 16)))
    nodes = tuple(node(cpus, name=f"n{i}") for i in range(count))
    free = {n.name: cpus for n in nodes}
    running: list[RunningJob] = []
    for i in range(draw(st.integers(0, 4))):
        where = draw(st.sampled_from([n.name for n in nodes]))
        if free[where] < 1:
            continue
        procs = draw(st.integers(1, free[where]))
        free[where] -= procs
        prio = draw(st.sampled_from(PRIORITY_TIERS))
        if draw(st.booleans()):
            least = draw(st.integers(1, procs))
            most = draw(st.integers(procs, cpus))
            running.append(
                run_elastic(
                    100 + i,
                    procs,
                    elastic(least, most, nodes=(1, draw(st.integers(1, 2)))),
                    prio=prio,
                    started=NOW - draw(st.sampled_from((1.0, 400.0))),
                    interval=300.0,
                    owner=draw(st.sampled_from(("u", "v"))),
                    where=where,
                )
            )
        else:
            running.append(RunningJob(100 + i, (Placement(where, procs, (), procs),), "v", prio))
    queue: list[QueuedJob] = []
    for i in range(draw(st.integers(0, 5))):
        prio = draw(st.sampled_from(PRIORITY_TIERS))
        owner = draw(st.sampled_from(("u", "v")))
        if draw(st.booleans()):
            least = draw(st.integers(1, cpus))
            most = draw(st.integers(least, cpus))
            span = draw(st.sampled_from(((1, 1), (1, 2), (2, 3))))
            queue.append(queued(i + 1, elastic(least, most, nodes=span), prio, owner))
        else:
            queue.append(fixed(i + 1, draw(st.integers(1, cpus)), prio, owner))
    quotas = {"u": Quota(cpus=draw(st.sampled_from((None, 4, 12))))}
    return Snapshot(
        nodes,
        tuple(running),
        tuple(queue),
        now=NOW,
        quotas=quotas,
        preemption=draw(st.booleans()),
    )


@settings(max_examples=400, deadline=None)
@given(scene=scenes())
def test_elastic_decisions_keep_every_rule(scene: Snapshot) -> None:
    d = decide(scene)
    queue = {j.id: j for j in scene.queued}
    running = {r.id: r for r in scene.running}
    capacity = {n.name: n.cpus for n in scene.nodes}
    load: dict[str, int] = defaultdict(int)
    for r in scene.running:
        for p in r.placements:
            load[p.node] += p.cpus
    for job_id, placements in d.starts:
        dem = queue[job_id].demand
        procs = {p.procs for p in placements}
        assert len(procs) == 1, "all or nothing: every node of a start has the same ranks"
        size = (len(placements), procs.pop())
        assert size in dem.sizes(), f"job {job_id} started at {size}, outside its range"
        assert len({p.node for p in placements}) == len(placements)
        for p in placements:
            load[p.node] += p.cpus
    for resize in d.resizes:
        r = running[resize.job]
        assert r.demand is not None and resize.new in r.demand.sizes(), "within MIN:MAX"
        assert resize.old == current_size(r)
        if resize.grow:
            assert scene.now - r.started_at >= r.resize_interval, "no growth in the interval"
            assert not any(
                tier_rank(queue[w].priority) >= tier_rank(r.priority)
                for w, why in d.waiting.items()
                if ": quota: " not in why
            ), "growth while a job of higher or equal priority waits"
            for p in r.placements:  # it grows where it runs (more ranks on its nodes)
                load[p.node] += (resize.new[1] - resize.old[1]) * r.demand.cpus_per_proc
        else:
            assert resize.for_job is not None
            head = queue[resize.for_job]
            assert tier_rank(r.priority) < tier_rank(head.priority), "shrinks only for higher"
            least = head.demand.smallest()
            assert any(capacity[p.node] >= least.cpus for p in r.placements), (
                "a shrink frees something on a node the job it was made for can use"
            )
            assert resize.new[0] * resize.new[1] < resize.old[0] * resize.old[1]
            assert not any(p.for_job == resize.for_job for p in d.preemptions)
    for name, used in load.items():
        assert used <= capacity[name], f"{name} over-committed: {used} > {capacity[name]}"
    # quotas counted at the current size: starts and growth keep an owner within its quota
    cap = scene.quotas["u"].cpus
    if cap is not None:
        before = sum(r.cpus for r in scene.running if r.owner == "u")
        after = before + sum(
            sum(p.cpus for p in pl) for job_id, pl in d.starts if queue[job_id].owner == "u"
        )
        after += sum(
            (rz.new[0] * rz.new[1] - rz.old[0] * rz.old[1])
            for rz in d.resizes
            if rz.grow and running[rz.job].owner == "u"
        )
        assert after <= max(cap, before)


def test_ps_shows_the_ranks_a_job_has_now_and_its_range() -> None:
    from trainhouse.cli.render import ranks

    spec = {"resources": {"nodes": 1, "procs_per_node": "2:8"}}
    running = {"state": "RUNNING", "spec": spec, "placement": {"nodes": [{"procs": 4}]}}
    assert ranks(running) == "4 (2:8)"
    assert ranks({"state": "QUEUED", "spec": spec, "placement": None}) == "8 (2:8)"
    wide = {"resources": {"nodes": "1:4", "procs_per_node": 2}}
    assert ranks({"state": "QUEUED", "spec": wide}) == "8 (2:8)"
    assert (
        ranks({"state": "QUEUED", "spec": {"resources": {"nodes": 2, "procs_per_node": 3}}}) == "6"
    )
