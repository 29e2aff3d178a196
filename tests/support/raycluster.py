"""A real (local) Ray cluster for the Ray executor's tests, and the servers that drive it.

The cluster is ``ray.cluster_utils.Cluster`` with small object stores, no dashboard, usage stats
and auth off, fast node-death detection, and its own short temp dir (``RAY_TMPDIR``, so nothing
lands in the machine's ``/tmp/ray`` and no bare ``ray.init()`` elsewhere can join it). Its
workers are told apart by a custom resource each (their label). Its teardown always runs, and
never ``ray stop`` (which would end every Ray process on the machine). The trainhouse servers
connect to it by address.

A node a test adds is a child of that test: the leak check ends it unless the test removes it
(:meth:`RayCluster.remove`) before it ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.servers import Server, start_server

__all__ = [
    "FAST_DEATH",
    "OBJECT_STORE",
    "RAY_ENV",
    "RayCluster",
    "agents",
    "node_base",
    "node_caches",
    "ray_server",
    "remove_tree",
    "running_ray_cluster",
    "wait_gone",
]

OBJECT_STORE = 80 * 1024 * 1024
FAST_DEATH = {  # a removed node is declared dead in about 1.5 s (Ray's default: 15 s or more)
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
    "prestart_worker_first_driver": False,
    "enable_worker_prestart": False,
}
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DEDUP_LOGS": "0",
}


class RayCluster:
    """A head (custom resource ``head``) and workers, each with a custom resource named after
    its label."""

    def __init__(self, tmp: Path, *, head_cpus: int, workers: Mapping[str, int]) -> None:
        from ray.cluster_utils import Cluster

        self.tmp = tmp
        self.cluster: Any = Cluster(
            initialize_head=True,
            connect=False,
            head_node_args={
                "num_cpus": head_cpus,
                "resources": {"head": 1},
                "include_dashboard": False,
                "object_store_memory": OBJECT_STORE,
                "_system_config": FAST_DEATH,
            },
        )
        self.workers: dict[str, Any] = {}
        self.removed: dict[str, Any] = {}  # the workers removed, by label
        for label, cpus in workers.items():
            self.add_worker(label, cpus)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_worker(self, label: str, cpus: int = 1) -> None:
        self.workers[label] = self.cluster.add_node(
            num_cpus=cpus, resources={label: 1}, object_store_memory=OBJECT_STORE
        )

    @property
    def head_ip(self) -> str:
        return str(self.cluster.head_node.node_ip_address)

    def worker_of(self, node_name: str) -> str | None:
        """The label of the worker (live or removed) a trainhouse node name
        (``host-<node id[:8]>``) is."""
        for label, node in [*self.workers.items(), *self.removed.items()]:
            if node_name.endswith(node.node_id[:8]):
                return label
        return None

    def remove(self, label: str) -> None:
        self.removed[label] = self.workers.pop(label)
        self.cluster.remove_node(self.removed[label], allow_graceful=False)

    def shutdown(self) -> None:
        self.cluster.shutdown()


@contextlib.contextmanager
def running_ray_cluster(
    *,
    head_cpus: int,
    workers: Mapping[str, int],
    env: Mapping[str, str] | None = None,
    unset: tuple[str, ...] = (),
) -> Iterator[RayCluster]:
    """A cluster of a head and ``workers`` (label -> CPUs), with ``env`` set and ``unset``
    removed in this process's environment (its nodes inherit it) while it runs."""
    pytest.importorskip("ray")
    # short (Ray's socket paths are limited to ~107 bytes) and outside the leak-checked TMPDIR
    tmp = Path(tempfile.mkdtemp(prefix="th-ray-", dir="/tmp"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", str(tmp))
        for key, value in {**RAY_ENV, **(env or {})}.items():
            mp.setenv(key, value)
        for key in unset:
            mp.delenv(key, raising=False)
        cluster: RayCluster | None = None
        try:
            cluster = RayCluster(tmp, head_cpus=head_cpus, workers=workers)
            yield cluster
        finally:
            if cluster is not None:
                with contextlib.suppress(Exception):
                    cluster.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


def ray_server(home: Path, cluster: RayCluster, *extra: str, port: int | None = None) -> Server:
    return start_server(
        home,
        "--executor",
        "ray",
        "--ray-address",
        cluster.address,
        "--ray-placement-timeout",
        "20",
        *extra,
        port=port,
    )


def node_base() -> Path:
    """The nodes' directory (``--ray-node-dir``'s default): on one machine, every node's."""
    return Path(tempfile.gettempdir()) / "trainhouse-ray"


def remove_tree(path: Path) -> None:
    """``shutil.rmtree`` of a tree with read-only directories (a dataset cache's views)."""
    for sub, _dirs, _files in os.walk(path):  # no symlink followed
        with contextlib.suppress(OSError):
            os.chmod(sub, 0o755)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def node_caches() -> Iterator[None]:
    """A Ray node keeps its jobs' compilers' caches in ``caches/`` of its directory (by default
    ``$TMPDIR/trainhouse-ray``) across attempts, on purpose, the jobs' environments in
    ``envs/`` and the staged dataset versions in ``datacache/``; everything else there goes
    with each attempt. The test leaves none behind."""
    yield
    base = node_base()
    deadline = time.monotonic() + 15
    while base.exists() and set(os.listdir(base)) - {"caches", "envs", "datacache"}:
        assert time.monotonic() < deadline, f"attempts left {sorted(os.listdir(base))} behind"
        time.sleep(0.2)
    remove_tree(base)


def agents() -> list[psutil.Process]:
    """Ray workers of this test process's clusters (its raylets' children, not another
    session's) that run a trainhouse node agent (their process title names the actor)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "NodeAgent" in " ".join(proc.cmdline()):
                found.append(proc)
    return found


def wait_gone(what: str, probe: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while probe():
        assert time.monotonic() < deadline, f"{what} still there: {probe()}"
        time.sleep(0.2)
