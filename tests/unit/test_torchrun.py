"""The process tree and the environment of one node, as both executors build them
(trainhouse.executors.node.torchrun), read back by the SDK's side
(trainhouse.jobfs.layout.JobEnv)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainhouse.executors.node import rank, torchrun
from trainhouse.jobfs.layout import MARKER_ENV, AttemptLayout, JobEnv
from trainhouse.spec import parse_spec

JOB = JobEnv(
    url="http://head:8470",
    job_id=12,
    job_name="digits",
    attempt=3,
    token="thj_12_secret",
    checkpoints="/srv/ckpt/12",
    hparams={"lr": 0.1},
)


def test_one_node_rendezvous_standalone_several_at_node_0() -> None:
    one = torchrun.command(Path("/a/exit-launcher"), ["python", "train.py"], procs=2)
    assert one[:4] == [
        sys.executable,
        "-m",
        "trainhouse.executors.node.supervise",
        "/a/exit-launcher",
    ]
    launch = [sys.executable, "-m", "trainhouse.executors.node.launch", "torch.distributed.run"]
    assert one[4:8] == launch
    assert "--standalone" in one and "--nproc-per-node=2" in one and "--max-restarts=0" in one
    wrapper = str(Path(rank.__file__).resolve())
    assert one[-7:] == ["--no-python", sys.executable, "-I", "-S", wrapper, "python", "train.py"]
    many = torchrun.command(
        Path("/a/x"), ["python", "t.py"], procs=4, nodes=3, node_rank=2, master=("10.0.0.1", 29500)
    )
    assert "--standalone" not in many
    for arg in ("--nnodes=3", "--node-rank=2", "--master-addr=10.0.0.1", "--master-port=29500"):
        assert arg in many
    with pytest.raises(ValueError, match="node 0's address"):
        torchrun.command(Path("/a/x"), ["t"], procs=1, nodes=2)


def test_a_rank_gets_the_spec_then_trainhouse_then_its_node() -> None:
    spec = parse_spec(
        "entrypoint: python train.py\nresources: {cpus_per_proc: 3}\nenv: {MY_FLAG: 'on'}\n"
    )
    base = {
        "PATH": "/usr/bin",
        "TRAINHOUSE_DB": "postgresql://secret@db/th",  # the server's: never a job's
        "RANK": "7",
        "RAY_ADDRESS": "10.0.0.1:6379",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    attempt = AttemptLayout(Path("/node/attempt"))
    env = torchrun.rank_environment(
        base,
        torchrun.spec_environment(spec),
        JOB,
        marker="home:12:3:1",
        gpus=["1", "3"],
        log_dir=Path("/node/logs"),
        attempt=attempt,
        cache=Path("/node/caches/12"),
        drop_prefixes=("RAY_",),
        pci_order=False,
    )
    assert env["PATH"] == "/usr/bin" and "RANK" not in env and "RAY_ADDRESS" not in env
    assert "TRAINHOUSE_DB" not in env
    assert (env["OMP_NUM_THREADS"], env["PYTHONUNBUFFERED"], env["MY_FLAG"]) == ("3", "1", "on")
    assert env[MARKER_ENV] == "home:12:3:1" and env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["TMPDIR"] == "/node/attempt/tmp"
    assert "CUDA_DEVICE_ORDER" not in env  # Ray's GPU ids: the node's own order
    # compiled kernels outlive the attempt: a restart does not compile again
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/node/caches/12/inductor"
    assert env["TRITON_CACHE_DIR"] == "/node/caches/12/triton"
    # the SDK and the rank wrapper read the same values back
    assert JobEnv.from_env(env) == JOB.on_node("/node/logs", "/node/attempt")
    assert env["TRAINHOUSE_TOKEN"] == env["TRAINHOUSE_JOB_TOKEN"] == "thj_12_secret"
    local = torchrun.rank_environment(
        base,
        {},
        JOB,
        marker="m",
        gpus=["GPU-8c9d0e1f-2222"],
        log_dir=Path("/l"),
        attempt=attempt,
        cache=Path("/c"),
    )
    assert local["RAY_ADDRESS"] == "10.0.0.1:6379"
    # GPUs by UUID, numbered in PCI bus order as NVML numbers them (CUDA's default is fastest
    # first)
    assert local["CUDA_VISIBLE_DEVICES"] == "GPU-8c9d0e1f-2222"
    assert local["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    chosen = torchrun.rank_environment(
        {"TRITON_CACHE_DIR": "/fast/triton"},
        {"TORCHINDUCTOR_CACHE_DIR": "/mine"},
        JOB,
        marker="m",
        gpus=[],
        log_dir=Path("/l"),
        attempt=attempt,
        cache=Path("/c"),
    )
    # a cache the spec or the node chose is kept
    assert chosen["TORCHINDUCTOR_CACHE_DIR"] == "/mine"
    assert chosen["TRITON_CACHE_DIR"] == "/fast/triton"


def test_a_checkpoint_url_and_a_standalone_process() -> None:
    remote = JobEnv(**{**JOB.__dict__, "checkpoints": "s3://bucket/12"})
    env = remote.to_env()
    assert env["TRAINHOUSE_CHECKPOINT_URL"] == "s3://bucket/12"
    assert "TRAINHOUSE_CHECKPOINT_DIR" not in env
    assert JobEnv.from_env(env) == remote
    assert JobEnv.from_env({"PATH": "/usr/bin"}) is None  # not under the server: standalone
