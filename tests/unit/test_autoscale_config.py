"""The Ray executor's reading of an autoscaler's node types (a cluster YAML as ``ray up`` and
``ray start --autoscaling-config`` take it; the GCS's ``ClusterConfig``), and the node events
it keeps. Ray itself is not needed: requests to a real autoscaler are in
tests/integration/test_autoscaler.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from trainhouse.core.cluster import NodeType
from trainhouse.executors.ray.attempt import node_name
from trainhouse.executors.ray.autoscale import (
    MAX_CONFIG,
    NodeWatch,
    read_config,
    types_from_config,
    types_from_gcs,
)

AWS = {
    "cluster_name": "trainhouse",
    "max_workers": 10,
    "idle_timeout_minutes": 5,
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 8}, "node_config": {}, "max_workers": 0},
        "cpu": {"resources": {"CPU": 16}, "min_workers": 0, "max_workers": 4},
        "gpu-8": {"resources": {"CPU": 96, "GPU": 8}, "min_workers": 0},
        "no-resources": {"node_config": {"InstanceType": "m5.large"}, "max_workers": 2},
    },
}


def test_a_cluster_yaml_gives_its_worker_types_and_cap() -> None:
    types, cap = types_from_config(AWS)
    assert cap == 10
    assert types == [
        NodeType("cpu", 16, 0, max_workers=4),
        NodeType("gpu-8", 96, 8, max_workers=10),  # no max_workers of its own: the cluster's
    ]  # the head (max_workers 0) and a type without resources are left out


def test_a_head_type_that_may_launch_workers_counts() -> None:
    config: dict[str, Any] = {
        "head_node_type": "h",
        "available_node_types": {"h": {"resources": {"CPU": 4}, "max_workers": 3}},
    }
    assert types_from_config(config) == ([NodeType("h", 4, 0, max_workers=3)], None)


def test_the_gcs_cluster_config() -> None:
    pb = pytest.importorskip("ray.core.generated.autoscaler_pb2")
    config = pb.ClusterConfig()
    group = config.node_group_configs.add()
    group.name, group.max_count = "gpu-8", 4
    group.resources["CPU"], group.resources["GPU"] = 96, 8
    unlimited = config.node_group_configs.add()
    unlimited.name, unlimited.max_count = "cpu", -1
    unlimited.resources["CPU"] = 16
    types, cap = types_from_gcs(config)
    assert cap is None
    assert types[0] == NodeType("gpu-8", 96, 8, max_workers=4)
    assert types[1].name == "cpu" and types[1].max_workers > 1000
    assert types_from_gcs(None) == ([], None)


def raw(node_id: str, cpus: int = 2) -> dict[str, Any]:
    return {"NodeID": node_id, "NodeManagerHostname": "vm", "Resources": {"CPU": cpus}}


def test_node_events_and_their_types_once_known() -> None:
    now = [100.0]
    watch = NodeWatch(clock=lambda: now[0])
    head, a, b = "a1b2c3d4" + "0" * 48, "f" * 51 + "00001", "f" * 51 + "00002"
    watch.observe([raw(head, 1)], {})
    assert watch.recent() == []  # what was there at the first read is no event
    now[0] = 110.0
    watch.observe([raw(head, 1), raw(a), raw(b)], {})
    now[0] = 120.0
    watch.observe([raw(head, 1), raw(b)], {a: "cpu-2", b: "cpu-2"})
    events = [(e["at"], e["node"], e["event"], e["node_type"]) for e in watch.recent()]
    assert events == [
        (110.0, "vm-ffffffff-00001", "joined", "cpu-2"),
        (110.0, "vm-ffffffff-00002", "joined", "cpu-2"),
        (120.0, "vm-ffffffff-00001", "left", "cpu-2"),
    ]


def test_node_names_are_unique_for_the_fake_providers_ids() -> None:
    assert node_name(raw("a1b2c3d4" + "9" * 48)) == "vm-a1b2c3d4"  # as it always was
    assert node_name(raw("f" * 51 + "00007")) == "vm-ffffffff-00007"


def test_the_config_a_command_line_names_is_read_as_hostile_input(tmp_path: Path) -> None:
    """Any process (a job's too) can look like Ray's autoscaler on the command line: a FIFO
    there must not block the read, a link is not followed, a huge file is not read."""
    good = tmp_path / "cluster.yaml"
    good.write_text("max_workers: 3\navailable_node_types: {}\n")
    assert read_config(good) == {"max_workers": 3, "available_node_types": {}}
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        read_config(fifo)  # returns at once: no writer is ever waited for
    link = tmp_path / "link.yaml"
    link.symlink_to(good)
    with pytest.raises(OSError):
        read_config(link)
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as fh:
        fh.truncate(MAX_CONFIG + 1)  # sparse: nothing is written, the size is over
    with pytest.raises(OSError, match="limit"):
        read_config(huge)
