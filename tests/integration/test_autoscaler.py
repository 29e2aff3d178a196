"""A Ray cluster that grows for the queue and shrinks after it: Ray's own autoscaler with its fake
multi-node provider (``RAY_FAKE_CLUSTER=1``: a launched node is a raylet on this machine),
driven by a real trainhouse server on the Ray executor.

The head is ``ray start --head --autoscaling-config=...`` with its own short temp dir and
ports; the provider is told the head's GCS address (its default, port 6379, is the machine's
Redis). Its node type ``cpu-2`` (2 CPU cores, at most 2) is what a 2-node job of 2 cores per node
needs: the head offers 1. The autoscaler ends idle nodes after ``idle_timeout_minutes`` (0.1:
6 s). Teardown ends the head and every node it launched by their process ids (each carries the
temp dir in its command line); never ``ray stop``, never ``AutoscalingCluster``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.jobs import write_job
from tests.support.processes import marked_processes
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.client.records import Nodes
from trainhouse.client.serverprocess import free_port

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray-autoscaler")]

OBJECT_STORE = 80 * 1024 * 1024
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}

SCRIPT = """
import os
import time

import torch
import torch.distributed as dist

import trainhouse

with trainhouse.init() as run:
    for step in range(3):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        time.sleep(0.2)
    total = torch.tensor([run.rank + 1.0])
    dist.all_reduce(total)
    print(
        f"rank {run.rank} of {run.world_size} on node {os.environ['GROUP_RANK']}: "
        f"sum {total.item():g}",
        flush=True,
    )
"""

SPEC = """
name: grows
entrypoint: python train.py
resources: {nodes: 2, procs_per_node: 1, cpus_per_proc: 2}
max_restarts: 0
"""


class AutoscalingHead:
    """A Ray head whose autoscaler launches fake nodes of type ``cpu-2`` on demand."""

    def __init__(self, tmp: Path) -> None:
        from ray._private.services import get_node_ip_address
        from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

        self.tmp = tmp
        ip: str = get_node_ip_address()  # type: ignore[no-untyped-call]
        self.address = f"{ip}:{free_port()}"
        self.config = tmp / "cluster.yaml"
        config = {
            "cluster_name": "trainhouse-test",
            "max_workers": 2,
            "idle_timeout_minutes": 0.1,
            "upscaling_speed": 1.0,
            "provider": {
                "type": "fake_multinode",
                "gcs_address": self.address,
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
                "launch_multiple": True,
            },
            "auth": {},
            "docker": {},
            "available_node_types": {
                "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
                "cpu-2": {
                    "resources": {"CPU": 2, "object_store_memory": OBJECT_STORE},
                    "node_config": {},
                    "min_workers": 0,
                    "max_workers": 2,
                },
            },
            "head_node_type": "ray.head.default",
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
        }
        self.config.write_text(json.dumps(config))  # YAML is a superset of JSON
        env = {
            **os.environ,
            **RAY_ENV,
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID,
            "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
        }
        ray = str(Path(sys.executable).parent / "ray")
        result = subprocess.run(
            [
                ray,
                "start",
                "--head",
                f"--port={self.address.rsplit(':', 1)[1]}",
                "--num-cpus=1",
                "--include-dashboard=false",
                f"--dashboard-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--ray-client-server-port={free_port()}",
                f"--object-store-memory={OBJECT_STORE}",
                f"--temp-dir={tmp / 'ray'}",
                f"--autoscaling-config={self.config}",
                "--disable-usage-stats",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def processes(self) -> list[psutil.Process]:
        """The head's processes and every launched node's (all name the temp dir)."""
        mark = str(self.tmp)
        found = []
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if mark in " ".join(proc.cmdline()):
                    found.append(proc)
        return found

    def raylets(self) -> int:
        return sum(1 for p in self.processes() if "raylet/raylet" in " ".join(p.cmdline()))

    def shutdown(self) -> None:
        """SIGKILL by pid, the autoscaler first (it must not launch more), until none is left."""
        deadline = time.monotonic() + 30
        while procs := self.processes():
            procs.sort(key=lambda p: "monitor.py" not in " ".join(p.cmdline()))
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(procs, timeout=5)
            if time.monotonic() > deadline:
                raise AssertionError(f"Ray processes left: {[p.pid for p in procs]}")


@pytest.fixture(scope="module")
def head() -> Iterator[AutoscalingHead]:
    pytest.importorskip("ray")
    # short (Ray's socket paths are limited to ~107 bytes) and outside the leak-checked TMPDIR
    tmp = Path(tempfile.mkdtemp(prefix="th-as-", dir="/tmp"))
    started: AutoscalingHead | None = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", str(tmp))
        for key, value in RAY_ENV.items():
            mp.setenv(key, value)
        try:
            started = AutoscalingHead(tmp)
            yield started
        finally:
            if started is not None:
                started.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


def until(what: str, probe: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.25)
    return value


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
        ], requests
        assert after["autoscaler"]["asked"] == []
        events = [(e["event"], e["node"], e["node_type"]) for e in after["node_events"]]
        assert sorted(e for e in events if e[0] == "joined") == sorted(
            ("joined", n, "cpu-2") for n in nodes
        ), events
        assert {n for what, n, _ in events if what == "left"} == set(nodes), events
        until("the launched nodes' raylets are gone", lambda: head.raylets() == 1, 30)

        # what the CLI shows of it
        top = srv.cli_json("top")
        assert [e["event"] for e in top["node_events"]].count("left") == 2, top
        frame = srv.cli("top", "--once").stdout
        assert "cpu-2" in frame and "left" in frame, frame
        assert not marked_processes()
    finally:
        assert_clean_stop(srv)
