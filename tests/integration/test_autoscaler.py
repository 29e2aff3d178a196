"""A Ray cluster that grows for the queue and shrinks after it: Ray's own autoscaler with its
fake multi-node provider (:mod:`tests.support.autoscaler`: one head for the module), driven by
a real trainhouse server on the Ray executor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.autoscaler import SCRIPT, SPEC, AutoscalingHead, autoscaling_head, until
from tests.support.jobs import write_job
from tests.support.processes import marked_processes
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.client.records import Nodes

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray-autoscaler")]


@pytest.fixture(scope="module")
def head() -> Iterator[AutoscalingHead]:
    pytest.importorskip("ray")
    with autoscaling_head() as started:
        yield started


def test_a_queued_gang_grows_the_cluster_which_shrinks_after(
    head: AutoscalingHead, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    srv: Server = start_server(
        home,
        "--executor",
        "ray",
        "--ray-address",
        head.address,
        "--ray-placement-timeout",
        "60",
        "--ray-node-dir",
        str(tmp_path / "nodes"),
        "--checkpoint-url",
        str(tmp_path / "ckpt"),
    )
    try:
        with srv.client as c:
            first = c.nodes()
            assert [n["cpus"] for n in first["nodes"]] == [1], first  # the head alone
            scaler = first["autoscaler"]
            assert scaler is not None, first
            assert scaler["node_types"] == [
                {"name": "cpu-2", "cpus": 2, "gpus": 0, "max_workers": 2, "up": 0}
            ]
            assert str(head.config) in scaler["source"]
            head_name = first["nodes"][0]["name"]

        # more than the autoscaler could ever add: refused at submit, naming the node types
        spec = write_job(tmp_path, SCRIPT, SPEC)
        never = srv.cli("submit", str(spec), "--detach", "--set", "resources.nodes=3")
        assert never.returncode == 2, never.stdout + never.stderr
        assert "cpu-2 (2 CPU cores, no GPUs)" in never.stderr + never.stdout

        # the head cannot take it, two cpu-2 nodes can: it waits for them, and says so
        job = srv.cli_json("submit", str(spec), "--detach")
        with srv.client as c:

            def asked() -> str | None:
                reason = c.job(job["id"]).get("reason") or ""
                return reason if "requested from the autoscaler" in reason else None

            reason = until("the job waits for the autoscaler's nodes", asked, 30)
            assert "waiting for 2 nodes of type cpu-2 requested from the autoscaler" in reason
            scaler = c.nodes()["autoscaler"]
            assert scaler is not None
            request = scaler["requests"][-1]
            assert request["bundles"] == [{"CPU": 2.0}, {"CPU": 2.0}], request
            assert request["jobs"] == [job["id"]]

        final = srv.wait(job["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=150)
        assert final["state"] == "COMPLETED", final
        nodes = [p["node"] for p in final["placement"]["nodes"]]
        assert len(set(nodes)) == 2 and head_name not in nodes, nodes
        logs = [srv.cli("logs", str(job["id"]), "--rank", r).stdout for r in ("0", "1")]
        assert "rank 0 of 2 on node 0: sum 3" in logs[0], logs
        assert "rank 1 of 2 on node 1: sum 3" in logs[1], logs

        # nothing waits: the request is withdrawn, and the idle nodes go after the timeout
        with srv.client as c:

            def shrunk() -> Nodes | None:
                now = c.nodes()
                return now if [n["name"] for n in now["nodes"]] == [head_name] else None

            after = until("the launched nodes are ended", shrunk, 90)
        assert after["autoscaler"] is not None
        # sent twice only: asked for (the same bundles while one node was up and one coming),
        # and withdrawn as the job started
        requests = after["autoscaler"]["requests"]
        assert [(r["bundles"], r["jobs"]) for r in requests] == [
            ([{"CPU": 2.0}, {"CPU": 2.0}], [job["id"]]),
            ([], []),
        ], [
            line
            for line in srv.log_tail(200_000).splitlines()
            if "autoscaler" in line or "job 1" in line
        ]
        assert after["autoscaler"]["asked"] == []
        # the job's nodes joined, and every node that joined left (on a busy machine Ray's
        # autoscaler may launch one more of its own, and end it at once or when idle)
        events = [(e["event"], e["node"], e["node_type"]) for e in after["node_events"]]
        joined = {n for what, n, _ in events if what == "joined"}
        left = {n for what, n, _ in events if what == "left"}
        assert joined == left and len(events) == 2 * len(joined), events
        assert {("joined", n, "cpu-2") for n in nodes} <= set(events), events
        until("the launched nodes' raylets are gone", lambda: head.raylets() == 1, 30)

        # what the CLI shows of it
        top = srv.cli_json("top")
        assert [e["event"] for e in top["node_events"]].count("left") == len(left), top
        frame = srv.cli("top", "--once").stdout
        assert "cpu-2" in frame and "left" in frame, frame
        assert not marked_processes()
    finally:
        assert_clean_stop(srv)
