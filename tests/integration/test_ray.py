"""The Ray executor on a real (local) Ray cluster: a head and two workers, told apart by custom
resources, shared by every test of this module (:mod:`tests.support.raycluster`: small object
stores, no dashboard, fast node-death detection, a temp dir of its own, never ``ray stop``). Its
nodes and the module's server hold the fake AWS credentials of :mod:`tests.support.s3` in their
environment (a node's own credentials are what staging an ``s3://`` dataset reads), and that
server takes datasets on loopback stores (``--dataset-allow-private``: moto's server)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import write_job
from tests.support.processes import marked_processes
from tests.support.raycluster import (
    RayCluster,
    agents,
    node_base,
    node_caches,
    ray_server,
    running_ray_cluster,
    wait_gone,
)
from tests.support.s3 import CREDENTIALS, MotoS3, fsspec_io, moto_s3
from tests.support.servers import EXAMPLE, Server, assert_clean_stop, example_module
from tests.support.wheels import write_wheel
from trainhouse.executors.ray.node import interface_of

# one Ray cluster for the module: under pytest-xdist its tests stay on one worker
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray-cluster")]
__all__ = ["fsspec_io", "moto_s3", "node_caches"]  # fixtures of tests.support

# AWS_* variables a developer's shell may hold that would point s3fs elsewhere
AWS_UNSET = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE")

# a job that is not in the repo: DDP over gloo, resumable, saying where each rank runs
DDP_SCRIPT = """
import os
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import trainhouse

with trainhouse.init(hparams={"steps": 40, "sleep": 0.1, "fail_at": -1}) as run:
    steps = int(run.hparams["steps"])
    run.set_total_steps(steps)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = DDP(model) if run.world_size > 1 else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    state = run.checkpoint.load()
    start = 0
    if state:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
    print(
        f"rank {run.rank} world {run.world_size} node {os.environ['GROUP_RANK']} "
        f"local {run.local_rank} attempt {run.attempt} starts at step {start} "
        f"on {os.environ.get('GLOO_SOCKET_IFNAME')}/{os.environ.get('NCCL_SOCKET_IFNAME')} "
        f"cache {os.environ['TORCHINDUCTOR_CACHE_DIR']} python {sys.prefix}",
        flush=True,
    )
    for step in range(start, steps):
        if run.rank == 1 and step == int(run.hparams["fail_at"]):
            raise RuntimeError(f"rank 1 gives up at step {step}")
        x = torch.randn(8, 4)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss.item()}, step=step)
        stop = run.should_stop()
        if stop or step % 5 == 0:
            run.checkpoint.save(
                {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, step=step
            )
        if stop:
            print(f"rank {run.rank} stopping at step {step}", flush=True)
            break
        time.sleep(float(run.hparams["sleep"]))
"""

SPEC = """
name: ray-ddp
entrypoint: python train.py
resources: {nodes: 2, procs_per_node: 1, cpus_per_proc: 1}
max_restarts: 0
"""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """A head of 2 CPUs and two workers of 1. The nodes' own credentials (fake: moto takes
    any) are inherited by every raylet and so by the node agents and the supervisors that
    stage s3:// datasets; and by the server."""
    with running_ray_cluster(
        head_cpus=2, workers={"worker_a": 1, "worker_b": 1}, env=CREDENTIALS, unset=AWS_UNSET
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("ray-server")
    srv = ray_server(
        root / "home",
        ray_cluster,
        "--checkpoint-url",
        str(root / "ckpt"),
        "--dataset-allow-private",  # moto's S3 server is on loopback
    )
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def steps_of(srv: Server, job_id: int) -> list[int]:
    series = srv.cli_json("metrics", str(job_id))["series"]
    loss = next(s for s in series if s["name"] == "loss")
    return [p[0] for p in loss["points"]]


def test_two_nodes_train_ddp(server: Server, ray_cluster: RayCluster, tmp_path: Path) -> None:
    """... with an environment of its own, which each node sets up in its node directory
    before torchrun starts (on one machine, as here, the nodes share that directory: one
    builds, the other waits for that build and reuses it), its torch the server's."""
    wheels, empty = tmp_path / "wheels", tmp_path / "empty-index"
    empty.mkdir()
    write_wheel(wheels, "thenv-ray", "1.5")
    env = f"{{packages: [thenv-ray], index_url: 'file://{empty}', find_links: ['{wheels}']}}"
    spec = write_job(tmp_path, DDP_SCRIPT, SPEC + f"environment: {env}\n")
    job = server.cli_json("submit", str(spec), "--detach", "--set", "hparams.steps=12")
    final = server.wait(job["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=120)
    assert final["state"] == "COMPLETED", final
    with server.client as c:
        launcher = c.logs(job["id"], rank="launcher")[0]
        assert c.job(job["id"])["environment"].startswith("environment built"), launcher
    assert launcher.count("setting up environment") == 2, launcher
    assert launcher.count("(built)") == 1 and launcher.count("(reused)") == 1, launcher
    (attempt,) = final["attempt_history"]
    assert attempt["rank_exit_codes"] == {"0": 0, "1": 0}
    nodes = [p["node"] for p in final["placement"]["nodes"]]
    assert len(set(nodes)) == 2, nodes
    logs = [server.cli("logs", str(job["id"]), "--rank", r).stdout for r in ("0", "1")]
    assert "rank 0 world 2 node 0 local 0 attempt 1" in logs[0], logs[0]
    assert "rank 1 world 2 node 1 local 0 attempt 1" in logs[1], logs[1]
    # gloo and NCCL are told the interface of the node's Ray address, not left to the hostname
    interface = interface_of(ray_cluster.head_ip)
    assert interface is not None
    for log in logs:
        assert f"on {interface}/{interface}" in log, log
        # the compilers' cache outlives the attempt: in the node's caches/, one per job
        assert "trainhouse-ray/caches/" in log and f"-{job['id']}/inductor" in log, log
        assert "python " + str(Path(tempfile.gettempdir()) / "trainhouse-ray" / "envs") in log
    assert steps_of(server, job["id"]) == list(range(12))
    wait_gone("node agents", agents)
    assert not marked_processes()


def test_cancel_leaves_no_process(server: Server, tmp_path: Path) -> None:
    spec = write_job(tmp_path, DDP_SCRIPT, SPEC)
    job = server.cli_json("submit", str(spec), "--detach", "--set", "hparams.steps=100000")
    server.wait_step(job["id"], 3)
    assert len(marked_processes()) >= 4  # per node: supervisor, torchrun, rank wrapper, rank
    result = server.cli("cancel", str(job["id"]))
    assert result.returncode == 0, result.stderr
    final = server.wait(job["id"], {"CANCELED", "FAILED", "COMPLETED"}, timeout=60)
    assert final["state"] == "CANCELED", final
    # should_stop() told both nodes' ranks, which stopped cleanly
    assert final["attempt_history"][0]["rank_exit_codes"] == {"0": 0, "1": 0}
    wait_gone("processes of the canceled job", marked_processes)
    wait_gone("node agents", agents)


def test_a_failing_rank_fails_the_job_on_every_node(server: Server, tmp_path: Path) -> None:
    spec = write_job(tmp_path, DDP_SCRIPT, SPEC)
    job = server.cli_json("submit", str(spec), "--detach", "--set", "hparams.fail_at=4")
    final = server.wait(job["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=120)
    assert final["state"] == "FAILED", final["reason"]
    (attempt,) = final["attempt_history"]
    assert (attempt["failure"], attempt["failed_rank"]) == ("user", 1), attempt
    assert "rank 1 gives up at step 4" in attempt["log_tail"]
    wait_gone("processes of the job", marked_processes)
    wait_gone("node agents", agents)


def test_multi_node_job_needs_shared_checkpoints(ray_cluster: RayCluster, tmp_path: Path) -> None:
    srv = ray_server(tmp_path / "home", ray_cluster, "--ray-node-dir", str(tmp_path / "nodes"))
    try:
        spec = write_job(tmp_path, DDP_SCRIPT, SPEC)
        result = srv.cli("submit", str(spec), "--detach")
        assert result.returncode == 2, result.stdout + result.stderr
        assert "--checkpoint-url" in result.stderr + result.stdout
        one = srv.cli_json(
            "submit",
            str(spec),
            "--detach",
            "--set",
            "resources.nodes=1",
            "--set",
            "hparams.steps=3",
        )
        final = srv.wait(one["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=90)
        assert final["state"] == "COMPLETED", final["reason"]
    finally:
        assert_clean_stop(srv)


def test_a_restarted_server_reattaches(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """SIGKILL: the ranks train on and the next server re-attaches to the same attempt.
    SIGTERM: the server stops the job on every node, and the next one resumes it."""
    home, ckpt = tmp_path / "home", str(tmp_path / "ckpt")
    srv = ray_server(home, ray_cluster, "--checkpoint-url", ckpt)
    spec = write_job(tmp_path, DDP_SCRIPT, SPEC)
    job = srv.cli_json("submit", str(spec), "--detach", "--set", "hparams.steps=50")
    srv.wait_step(job["id"], 8)
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    assert marked_processes(), "the ranks should outlive a killed server"
    srv = ray_server(home, ray_cluster, "--checkpoint-url", ckpt, port=srv.port)
    try:
        assert srv.wait_step(job["id"], 20)["attempts"] == 1  # the same attempt goes on
    finally:
        assert_clean_stop(srv)
    wait_gone("processes of the job", marked_processes)
    wait_gone("node agents", agents)
    srv = ray_server(home, ray_cluster, "--checkpoint-url", ckpt, port=srv.port)
    try:
        final = srv.wait(job["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=120)
        assert final["state"] == "COMPLETED", final["reason"]
        results = [a["result"] for a in final["attempt_history"]]
        assert results == ["interrupted", "completed"], final["attempt_history"]
        assert steps_of(srv, job["id"]) == list(range(50))  # each step exactly once
        log1 = srv.cli("logs", str(job["id"]), "--rank", "1").stdout
        assert log1.count("attempt 1 starts at step 0") == 1, log1  # the logs, once each
        assert "attempt 2 starts at step" in log1
        wait_gone("processes of the job", marked_processes)
    finally:
        assert_clean_stop(srv)


# a job that reads every file of every version it pins and checks its bytes against hparams
DATA_SCRIPT = """
import hashlib
import os
import stat

import trainhouse

with trainhouse.init() as run:
    expected = run.hparams["expected"]
    seen = {}
    for key, root in sorted(run.datasets.items()):
        assert os.environ["TRAINHOUSE_DATASET_" + key.upper()] == str(root)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                assert stat.S_IMODE(path.lstat().st_mode) == 0o444, path
                rel = key + "/" + path.relative_to(root).as_posix()
                seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    assert seen == expected, (seen, expected)
    print(
        f"rank {run.rank} node {os.environ['GROUP_RANK']} checked {len(seen)} files "
        f"of {run.datasets['train']}",
        flush=True,
    )
    run.log({"files": len(seen)}, step=0)
"""


def data_spec(datasets: dict[str, str], expected: dict[str, str]) -> str:
    spec = {
        "name": "ray-data",
        "entrypoint": "python train.py",
        "resources": {"nodes": 2, "procs_per_node": 1, "cpus_per_proc": 1},
        "max_restarts": 0,
        "datasets": datasets,
        "hparams": {"expected": expected},
    }
    return json.dumps(spec)  # YAML reads JSON


def add_s3(srv: Server, s3: MotoS3, name: str, url: str) -> dict[str, Any]:
    option = f"endpoint_url={s3.endpoint_url}"
    added = srv.cli_json("datasets", "add", name, url, "--storage-option", option)
    return dict(added["version"])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_two_nodes_stage_each_dataset_once_per_node(
    server: Server, moto_s3: MotoS3, tmp_path: Path
) -> None:
    """A job of two nodes pins an S3 version (each node reads the store with its own
    credentials) and an uploaded one (each node reads it from the server, with the job's
    credential); every node's supervisor stages both before its ranks start, and every rank
    reads exactly the registered bytes. On one machine, as here, the nodes share the node
    directory and so its dataset cache: one node fetches a version, the other waits for that
    and finds it cached; the store serves each object once."""
    s3 = moto_s3
    bucket = s3.make_bucket("ray-data")
    objects = {
        "set/a.bin": os.urandom(300_000),
        "set/sub/b.bin": os.urandom(70_000),
        "set/labels.csv": b"label\n1\n2\n",
    }
    for key, data in objects.items():
        s3.put(bucket, key, data)
    s3_version = add_s3(server, s3, "ray-s3", f"s3://{bucket}/set")
    assert (s3_version["version"], s3_version["files"]) == (1, 3), s3_version
    uploaded = {"deep/v.txt": b"validation", "w.bin": os.urandom(50_000)}
    local = tmp_path / "val"
    for rel, data in uploaded.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
    up_version = server.cli_json("datasets", "add", "ray-up", str(local))["version"]
    assert up_version["source"] is None and up_version["files"] == 2, up_version

    expected = {"train/" + k.removeprefix("set/"): sha(d) for k, d in objects.items()}
    expected |= {"val/" + rel: sha(d) for rel, d in uploaded.items()}
    pins = {"train": "ray-s3@1", "val": "ray-up@1"}
    spec = write_job(tmp_path, DATA_SCRIPT, data_spec(pins, expected))
    job = server.cli_json("submit", str(spec), "--detach")
    final = server.wait(job["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=120)
    with server.client as c:
        launcher = c.logs(job["id"], rank="launcher")[0]
    assert final["state"] == "COMPLETED", (final["reason"], launcher)
    (attempt,) = final["attempt_history"]
    assert attempt["rank_exit_codes"] == {"0": 0, "1": 0}, attempt
    assert len({p["node"] for p in final["placement"]["nodes"]}) == 2, final["placement"]
    assert [(p["key"], p["ref"]) for p in final["datasets"]] == sorted(pins.items())
    assert final["staging"] is not None and "ready in" in final["staging"], final["staging"]
    assert final["latest_metrics"]["files"] == len(expected)
    for rank in ("0", "1"):
        log = server.cli("logs", str(job["id"]), "--rank", rank).stdout
        assert f"rank {rank} node {rank} checked {len(expected)} files" in log, log

    # each node staged each version once, into the node's cache, and said so
    cache = node_base() / "datacache"
    digests = {p["ref"]: p["digest"] for p in final["datasets"]}
    for ref, files in (("ray-s3@1", len(objects)), ("ray-up@1", len(uploaded))):
        view = cache / "views" / digests[ref]
        cached = []
        for node in (0, 1):
            lines = [
                ln
                for ln in launcher.splitlines()
                if ln.startswith(f"[node {node}] trainhouse: staging {ref}: ready in ")
            ]
            assert len(lines) == 1, (node, ref, launcher)
            assert lines[0].endswith(f" at {view}"), lines[0]
            cached.append(int(lines[0].split(" fetched, ")[1].split(" files cached")[0]))
        # one node fetched every file; the other waited for it and fetched none
        assert sorted(cached) == [0, files], (ref, launcher)
        assert (cache / ".ready" / digests[ref]).is_file(), sorted(os.listdir(cache / ".ready"))
        held = {
            p.relative_to(view).as_posix(): sha(p.read_bytes())
            for p in view.rglob("*")
            if p.is_file()
        }
        key = "train" if ref == "ray-s3@1" else "val"
        assert held == {k.split("/", 1)[1]: v for k, v in expected.items() if k.startswith(key)}
    # the store served each object once (at most once per node; here one cache for both)
    for key in objects:
        assert s3.gets(bucket, key) == 1, (key, s3.get_counts())
    wait_gone("processes of the job", marked_processes)
    wait_gone("node agents", agents)


def test_a_dataset_that_cannot_be_staged_fails_the_job_with_the_reason(
    server: Server, moto_s3: MotoS3, tmp_path: Path
) -> None:
    """An object changed in the bucket after its version was registered: the nodes that stage
    it fail, the others are stopped, and the job fails at once (no restart) with the reason the
    node's log gave (its launcher lines, prefixed ``[node N]``, name the file)."""
    s3 = moto_s3
    bucket = s3.make_bucket("ray-changing")
    s3.put(bucket, "set/one.bin", b"1" * 5000)
    s3.put(bucket, "set/two.bin", b"2" * 5000)
    add_s3(server, s3, "ray-changing", f"s3://{bucket}/set")
    s3.put(bucket, "set/two.bin", b"3" * 5001)  # changed under the registered version
    spec = write_job(tmp_path, DATA_SCRIPT, data_spec({"train": "ray-changing@1"}, {}))
    job = server.cli_json("submit", str(spec), "--detach")
    final = server.wait(job["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=120)
    with server.client as c:
        launcher = c.logs(job["id"], rank="launcher")[0]
    assert final["state"] == "FAILED", (final, launcher)
    # the summary is the cause the node's line gave, without its ``[node N]`` prefix
    summary = "attempt 1 failed: a dataset could not be staged: dataset file 'two.bin' changed "
    assert final["reason"].startswith(summary + "since it was registered"), final["reason"]
    assert final["restarts"] == 0 and final["infra_restarts"] == 0, final
    assert "[node 0] trainhouse: a dataset could not be staged" in launcher or (
        "[node 1] trainhouse: a dataset could not be staged" in launcher
    ), launcher
    assert "staging failed" in server.cli("show", str(job["id"])).stdout
    wait_gone("processes of the job", marked_processes)
    wait_gone("node agents", agents)


def test_a_lost_node_restarts_the_job_from_its_checkpoint(
    server: Server, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """Last in the module: the cluster keeps a node less (a node added back would be a child
    of this test, which the leak check would end)."""
    spec = write_job(tmp_path, DDP_SCRIPT, SPEC)
    job = server.cli_json("submit", str(spec), "--detach", "--set", "hparams.steps=40")
    running = server.wait_step(job["id"], 12)
    nodes = [p["node"] for p in running["placement"]["nodes"]]
    victim = next(w for w in map(ray_cluster.worker_of, nodes) if w is not None)
    lost_rank = [ray_cluster.worker_of(n) for n in nodes].index(victim)
    ray_cluster.remove(victim)
    final = server.wait(job["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=150)
    assert final["state"] == "COMPLETED", final["reason"]
    first, second = final["attempt_history"]
    assert first["failure"] == "infra", first
    assert first["failed_rank"] == lost_rank, first
    assert second["result"] == "completed"
    assert final["infra_restarts"] == 1 and final["restarts"] == 0
    replaced = [p["node"] for p in final["placement"]["nodes"]]
    assert all(ray_cluster.worker_of(n) != victim for n in replaced), replaced
    assert steps_of(server, job["id"]) == list(range(40))  # each step exactly once
    logs = [server.cli("logs", str(job["id"]), "--rank", r).stdout for r in ("0", "1")]
    assert "was lost" in logs[lost_rank]
    resumed = int(logs[0].split("attempt 2 starts at step ")[1].split()[0])
    assert resumed >= 6 and resumed % 5 == 1, logs[0]  # after a checkpoint (every 5 steps)
    wait_gone("processes of the job", marked_processes)
    wait_gone("node agents", agents)


def test_a_service_replica_listens_where_the_server_reaches_it(
    server: Server, ray_cluster: RayCluster
) -> None:
    """A service's replica on Ray listens on its node's Ray address (a loopback address on
    another node than the server's would be the server's own), which the server checks
    against the node its rank was placed on; predictions reach it there."""
    job = server.cli_json(
        "submit", str(EXAMPLE), "--set", "hparams.epochs=1", "--set", "hparams.save_model=rayd"
    )
    assert job["state"] == "COMPLETED", job
    started = server.cli_json("serve", "rayd@1", "--max-wait-ms", "1")
    try:
        deadline = time.monotonic() + 180
        while (shown := server.cli_json("serve", "show", "rayd"))["state"] != "ready":
            assert time.monotonic() < deadline, shown
            time.sleep(0.5)
        (replica,) = shown["replica_list"]
        assert replica["url"].startswith(f"http://{ray_cluster.head_ip}:"), replica
        _, val = example_module().datasets(0)
        with server.client as c:
            answer = c.predict("rayd", val.tensors[0][:3].tolist())
        assert (answer["version"], len(answer["outputs"])) == (1, 3), answer
    finally:
        server.cli("serve", "stop", "rayd")
    server.wait(started["job_id"], {"CANCELED"}, timeout=60)
