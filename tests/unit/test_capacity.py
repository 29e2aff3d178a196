"""What the scheduler asks a cluster's autoscaler for (pure): which waiting jobs, how many nodes
of which type, the bundles of the request; and the submit check that counts the nodes the
autoscaler can add. Decisions come from the real policy."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trainhouse.core.cluster import Bundle, Gpu, Node, NodeType, Placement, Wants
from trainhouse.scheduler.capacity import never_fits, potential_nodes, wants
from trainhouse.scheduler.policy import QueuedJob, Quota, RunningJob, Snapshot, decide
from trainhouse.scheduler.resources import Demand
from trainhouse.spec import Resources

CPU2 = NodeType("cpu-2", 2, 0, max_workers=2)
GPU8 = NodeType("gpu-8", 32, 8, max_workers=4)


def node(name: str, cpus: int, gpus: int = 0) -> Node:
    return Node(name, cpus, 1 << 34, tuple(Gpu(i) for i in range(gpus)))


def job(
    i: int, cpus: int = 1, gpus: int = 0, nodes: int = 1, owner: str = "u", prio: str = "normal"
) -> QueuedJob:
    return QueuedJob(i, prio, float(i), Demand(nodes, cpus, gpus, 1), owner)


def run(i: int, where: str, cpus: int, owner: str = "u", prio: str = "normal") -> RunningJob:
    return RunningJob(i, (Placement(where, cpus, (), 1),), owner, prio, started_at=0.0)


def snap(nodes: list[Node], queued: list[QueuedJob], **kw: Any) -> Snapshot:
    kw.setdefault("running", ())
    return Snapshot(tuple(nodes), queued=tuple(queued), now=100.0, **kw)


def ask(
    s: Snapshot, types: list[NodeType], **kw: int
) -> tuple[dict[int, tuple[str, int]], list[Bundle]]:
    w = wants(s, decide(s), types, **kw)
    return {x.job: (x.node_type, x.nodes) for x in w.jobs}, w.bundles()


def test_no_node_types_no_request() -> None:
    s = snap([node("head", 1)], [job(1, cpus=2, nodes=2)])
    assert wants(s, decide(s), []).bundles() == []


def test_a_gang_asks_for_whole_nodes_of_a_type_that_fits() -> None:
    s = snap([node("head", 1)], [job(1, cpus=2, nodes=2)])
    asked, bundles = ask(s, [CPU2, GPU8])
    assert asked == {1: ("cpu-2", 2)}  # the smallest type that fits, not the GPU one
    assert bundles == [{"CPU": 2.0}, {"CPU": 2.0}]


def test_a_gang_on_new_nodes_asks_for_them_whole() -> None:
    # one node's share is 1 CPU, but a gang needs distinct nodes: whole nodes are asked for
    s = snap([node("head", 0)], [job(1, cpus=1, nodes=2)])
    asked, bundles = ask(s, [CPU2])
    assert asked == {1: ("cpu-2", 2)}
    assert bundles == [{"CPU": 2.0}, {"CPU": 2.0}]


def test_what_runs_is_in_the_request_and_a_free_node_serves_part_of_a_gang() -> None:
    nodes = [node("head", 1), node("w1", 2), node("w2", 2)]
    s = snap(nodes, [job(2, cpus=2, nodes=2)], running=(run(1, "w1", 2),))
    asked, bundles = ask(s, [CPU2.__class__("cpu-2", 2, 0, max_workers=3, up=2)])
    assert asked == {2: ("cpu-2", 1)}  # w2 is free; one more node
    assert bundles == [{"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 2.0}]


def test_a_job_that_fits_what_is_free_asks_for_nothing() -> None:
    s = snap([node("a", 4)], [job(1, cpus=2), job(2, cpus=1)])
    d = decide(s)
    assert d.starts
    assert wants(s, d, [CPU2]).bundles() == []


def test_single_node_jobs_share_an_asked_node() -> None:
    s = snap([node("head", 0)], [job(1, cpus=1), job(2, cpus=1), job(3, cpus=1)])
    asked, bundles = ask(s, [CPU2])
    assert asked == {1: ("cpu-2", 1), 2: ("cpu-2", 0), 3: ("cpu-2", 1)}
    assert bundles == [{"CPU": 1.0}] * 3


def test_quota_bounds_what_is_asked() -> None:
    # u may use 4 CPU cores: the policy lets all three wait for nodes, but only two could run
    s = snap(
        [node("head", 0)],
        [job(1, cpus=2), job(2, cpus=2), job(3, cpus=2), job(4, cpus=2, owner="v")],
        quotas={"u": Quota(cpus=4)},
    )
    asked, _ = ask(s, [NodeType("cpu-2", 2, 0, max_workers=8)])
    assert sorted(asked) == [1, 2, 4]


def test_a_job_waiting_on_its_quota_is_not_asked_for() -> None:
    s = snap(
        [node("w1", 2)],
        [job(2, cpus=2)],
        running=(run(1, "w1", 2),),
        quotas={"u": Quota(cpus=2)},
    )
    d = decide(s)
    assert "quota:" in d.waiting[2]
    assert wants(s, d, [CPU2]).bundles() == []


def test_max_workers_bound_the_request_and_the_job_hears_why() -> None:
    full = NodeType("cpu-2", 2, 0, max_workers=2, up=1)
    s = snap(
        [node("head", 0), node("w1", 2)], [job(2, cpus=2, nodes=2)], running=(run(1, "w1", 2),)
    )
    w = wants(s, decide(s), [full])
    assert w.bundles() == []
    assert "cpu-2 at 1 of max_workers 2" in w.unmet[2]
    # the cluster's own cap counts every type together
    s2 = snap([node("head", 0)], [job(1, cpus=2, nodes=2)])
    w2 = wants(s2, decide(s2), [CPU2], max_workers=1)
    assert w2.bundles() == [] and "the cluster at 0 of its max_workers 1" in w2.unmet[1]


def test_the_job_preempted_for_is_not_asked_for() -> None:
    s = snap([node("w1", 2)], [job(2, cpus=2, prio="high")], running=(run(1, "w1", 2),))
    d = decide(s)
    assert d.preemptions
    assert wants(s, d, [CPU2]).bundles() == []


def test_potential_nodes_and_the_submit_check_name_the_types() -> None:
    types = [NodeType("cpu-2", 2, 0, max_workers=2, up=1), GPU8]
    assert Counter(n.name.split("-")[0] for n in potential_nodes(types)) == {"+cpu": 1, "+gpu": 4}
    head = [node("head", 1)]
    gang = Resources(nodes=3, procs_per_node=1, cpus_per_proc=2)
    assert never_fits(head, types, gang, multi_node=True) is None  # 1 cpu-2 + gpu-8s
    big = Resources(nodes=1, procs_per_node=1, cpus_per_proc=64)
    reason = never_fits(head, types, big, multi_node=True)
    assert reason is not None and "cpu-2 (2 CPU cores, no GPUs)" in reason
    assert "gpu-8 (32 CPU cores, 8 GPU(s))" in reason
    # no autoscaler: the check as it was
    assert (
        never_fits(head, [], gang, multi_node=True)
        == "resources.nodes is 3, but the cluster has 1 node(s)"
    )


@settings(max_examples=150, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.integers(1, 3),  # nodes
            st.integers(1, 4),  # cpus
            st.integers(0, 8),  # gpus
            st.sampled_from(["u", "v"]),
            st.sampled_from(["low", "normal", "high"]),
        ),
        max_size=12,
    ),
    busy=st.integers(0, 2),
    up=st.integers(0, 2),
    cap=st.one_of(st.none(), st.integers(0, 6)),
)
def test_properties(
    jobs: list[tuple[int, int, int, str, str]], busy: int, up: int, cap: int | None
) -> None:
    nodes = [node("w1", 4), node("w2", 4, 8)]
    queued = [job(i, c, g, n, o, p) for i, (n, c, g, o, p) in enumerate(jobs, start=10)]
    running = tuple(run(i, "w1", 2, "u") for i in range(busy))
    types = [NodeType("cpu-4", 4, 0, max_workers=3, up=up), NodeType("gpu-8", 16, 8, 2)]
    s = snap(nodes, queued, running=running, quotas={"v": Quota(cpus=6)})
    d = decide(s)
    w = wants(s, d, types, max_workers=cap)
    new: Counter[str] = Counter()
    for x in w.jobs:
        assert x.job in d.waiting and "quota:" not in d.waiting[x.job]
        assert len(x.bundles) == next(j for j in queued if j.id == x.job).demand.nodes
        new[x.node_type] += x.nodes
    for t in types:
        assert new[t.name] <= t.room  # never past a type's max_workers
    if cap is not None:
        assert sum(new.values()) <= max(cap - up, 0)
    # v's asked jobs stay within v's quota
    assert (
        sum(
            j.demand.nodes * j.demand.cpus
            for j in queued
            if j.owner == "v" and j.id in {x.job for x in w.jobs}
        )
        <= 6
    )
    assert (w.bundles() == []) == (not w.jobs)


def test_an_ask_is_kept_while_its_job_still_waits_for_the_nodes_being_launched() -> None:
    # asked for 2 new nodes; one is up but its resources are not reported yet: no room seems left
    first = snap([node("head", 0)], [job(1, cpus=2, nodes=2)])
    before = wants(first, decide(first), [CPU2])
    up = NodeType("cpu-2", 2, 0, max_workers=2, up=1)
    s = snap([node("head", 0), node("w1", 0)], [job(1, cpus=2, nodes=2)])
    now = wants(s, decide(s), [up])
    assert not now.jobs and 1 in now.unmet
    kept = now.keeping(before.jobs)
    assert kept.jobs == before.jobs and kept.bundles() == before.bundles() and not kept.unmet
    # placed, canceled or held by its quota: not in unmet, and its ask goes
    assert Wants().keeping(before.jobs).bundles() == []


def test_an_elastic_job_is_asked_for_at_its_least() -> None:
    # nodes "2:4" of 2 CPUs each: two new nodes start it; it grows onto more as they come
    elastic = Demand(4, 2, 0, 2, min_nodes=2, min_procs=2, cpus_per_proc=1)
    s = snap([node("head", 1)], [QueuedJob(1, "normal", 1.0, elastic, "u")])
    asked, bundles = ask(s, [CPU2.__class__("cpu-2", 2, 0, max_workers=8)])
    assert asked == {1: ("cpu-2", 2)}
    assert bundles == [{"CPU": 2.0}, {"CPU": 2.0}]
