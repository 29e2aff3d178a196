"""The Nodes page of a server on a Ray cluster that grows for the queue (Ray's autoscaler with
its fake multi-node provider, :mod:`tests.support.autoscaler`), in real Chromium: the node
types, the job asked for, the requests, and the nodes that joined and left, as the API says."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.autoscaler import SCRIPT, SPEC, AutoscalingHead, autoscaling_head, until
from tests.support.dashboard import api
from tests.support.jobs import write_job
from tests.support.servers import assert_clean_stop, start_server

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.xdist_group("ray-autoscaler")]


@pytest.fixture(scope="module")
def head() -> Iterator[AutoscalingHead]:
    pytest.importorskip("ray")
    with autoscaling_head() as started:
        yield started


def test_the_nodes_page_shows_the_cluster_growing_and_shrinking(
    head: AutoscalingHead, page: Page, tmp_path: Path
) -> None:
    srv = start_server(
        tmp_path / "home",
        "--executor",
        "ray",
        "--ray-address",
        head.address,
        "--ray-node-dir",
        str(tmp_path / "nodes"),
        "--checkpoint-url",
        str(tmp_path / "ckpt"),
    )
    try:
        page.goto(f"{srv.url}/#/nodes")
        panel = page.get_by_test_id("cluster-panel")
        expect(panel.get_by_test_id("autoscaler-types")).to_have_text("cpu-2 (2 CPU): 0 of 2")
        expect(panel.get_by_test_id("autoscaler-asked")).to_have_text("nothing")

        job = srv.cli_json("submit", str(write_job(tmp_path, SCRIPT, SPEC)), "--detach")
        # 2 nodes asked for, or 1 once the first of them has joined (the fake provider is quick)
        expect(panel.get_by_test_id("autoscaler-asked")).to_contain_text(
            re.compile(rf"job {job['id']}: [12] node\(s\) of cpu-2")
        )
        request = panel.get_by_test_id("autoscaler-request").first
        expect(request).to_contain_text("2 CPU, 2 CPU")
        expect(request).to_contain_text(str(job["id"]))

        final = srv.wait(job["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=150)
        assert final["state"] == "COMPLETED", final
        until("the launched nodes are ended", lambda: len(api(srv, "/nodes")["nodes"]) == 1, 90)
        events = api(srv, "/nodes")["node_events"]
        rows = panel.get_by_test_id("node-event")
        expect(rows).to_have_count(len(events))
        left = [e for e in events if e["event"] == "left"]
        # the nodes the job ran on name their type; a node the autoscaler launched beyond them
        # and ended within one of its reports (the fake provider is quick) has none to name
        typed = [e for e in left if e["node_type"] == "cpu-2"]
        assert len(typed) >= 2 and all(e["node_type"] in ("cpu-2", None) for e in left), events
        expect(panel.locator("[data-testid=node-event][data-event=left]")).to_have_count(len(left))
        expect(rows.first).to_contain_text("cpu-2")  # the newest first
        expect(request).to_contain_text("nothing (withdrawn)")
        expect(page.get_by_test_id("node-card")).to_have_count(1)
    finally:
        assert_clean_stop(srv)
