"""A Ray head whose autoscaler launches nodes on this machine: Ray's fake multi-node provider
(``RAY_FAKE_CLUSTER=1``: a launched node is a raylet here), for the tests of a cluster that
grows for the queue (tests/integration/test_autoscaler.py, tests/browser/
test_autoscaler_page.py).

The head is ``ray start --head --autoscaling-config=...`` with its own short temp dir and
ports; the provider is told the head's GCS address (its default, port 6379, is the machine's
Redis). Its node type ``cpu-2`` (2 CPU cores, at most 2) is what a 2-node job of 2 cores per node
needs: the head offers 1. The autoscaler ends idle nodes after ``idle_timeout_minutes`` (0.1:
6 s). :func:`autoscaling_head` ends the head and every node it launched by their process ids
(each carries the temp dir in its command line); never ``ray stop``, never
``AutoscalingCluster`` (both end every Ray process on the machine). Ray's autoscaler v1 runs:
v2 with the fake provider needs a file (``fake_multi_node/example.yaml``) Ray's wheel lacks.
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

from trainhouse.client.serverprocess import free_port

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


@contextlib.contextmanager
def autoscaling_head() -> Iterator[AutoscalingHead]:
    """A head in a short temp dir outside the leak-checked TMPDIR (Ray's socket paths are
    limited to ~107 bytes), ended with everything it launched."""
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
    """``probe()``'s first true value, polled until ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.25)
    return value
