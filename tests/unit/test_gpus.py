"""Which GPUs a node offers and how a job names them (issue 20, items 6 and 8): NVML UUIDs in
CUDA_VISIBLE_DEVICES, the server's own mask honoured, MIG instances offered as GPUs of their
own, and per-job GPU memory matched across PID namespaces. NVML is a fake here
(tests/support/nvml.py); tests/gpu checks the same against a real driver."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.api import app_client, services, submit, wait_state, workdir
from tests.support.fakes import FakeExecutor
from tests.support.nvml import FakeGpu, FakeMig, FakeNvml, FakeProcess
from tests.support.records import new_job
from trainhouse.core import metricnames as names
from trainhouse.core.cluster import Gpu, Node
from trainhouse.executors.inventory import local_node, parse_gpus
from trainhouse.jobfs.nvml import Nvml, detect_gpus, parse_mask
from trainhouse.monitoring.sampler import Sampler, nspids
from trainhouse.store import Store

UUIDS = [
    "GPU-0a1b2c3d-0000-0000-0000-000000000000",
    "GPU-4e5f6a7b-1111-1111-1111-111111111111",
    "GPU-8c9d0e1f-2222-2222-2222-222222222222",
]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([FakeGpu(u) for u in UUIDS])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def test_every_gpu_is_offered_with_its_uuid_and_named_by_it(nvml: FakeNvml) -> None:
    gpus = detect_gpus()
    assert [(g.index, g.uuid, g.model) for g in gpus] == [
        (i, u, "NVIDIA H200") for i, u in enumerate(UUIDS)
    ]
    assert gpus[0].memory_bytes == 141 << 30 and gpus[0].parent is None
    node = Node("n", 8, 1 << 30, tuple(gpus))
    # CUDA orders devices fastest first; a UUID means the same GPU in every order
    assert node.visible_ids([2, 0]) == [UUIDS[2], UUIDS[0]]
    assert Node("n", 8, 1 << 30, (Gpu(1),)).visible_ids([1]) == ["1"]  # declared: its index


@pytest.mark.parametrize(
    ("mask", "offered"),
    [
        ("1,2", [1, 2]),
        ("2, 0", [0, 2]),
        (f"{UUIDS[2]},{UUIDS[0][:12]}", [0, 2]),  # a unique prefix names a GPU too
        ("1,7,2", [1]),  # CUDA stops at the first entry that names nothing
        ("1,-1,2", [1]),
        ("", []),
        ("-1", []),
    ],
)
def test_a_mask_the_server_inherits_limits_what_it_offers(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, mask: str, offered: list[int]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
    node = local_node()
    assert [g.index for g in node.gpus] == offered
    assert [g.uuid for g in node.gpus] == [UUIDS[i] for i in offered]


def test_declared_gpus_are_the_entries_of_the_servers_mask() -> None:
    gpus = parse_gpus("2", parse_mask("5,GPU-abc,7"))
    assert [(g.index, g.visible_id) for g in gpus] == [(0, "5"), (1, "GPU-abc")]
    assert [g.visible_id for g in parse_gpus("0,2", None)] == ["0", "2"]
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES names 3 device"):
        parse_gpus("4", parse_mask("5,GPU-abc,7"))


MIG_GPU = FakeGpu(
    "GPU-mig0-aaaa",
    mig=[
        FakeMig("MIG-first-aaaa", gpu_instance=3),
        None,  # an empty slot
        FakeMig("MIG-second-bbbb", gpu_instance=5, memory=35 << 30, name="NVIDIA H200 2g.35gb"),
    ],
    processes=[
        FakeProcess(1_000_001, 2 << 30, gpu_instance=5, compute_instance=0),
        FakeProcess(1_000_002, 1 << 30, gpu_instance=3, compute_instance=0),
    ],
)


@pytest.fixture
def mig(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([FakeGpu(UUIDS[0]), MIG_GPU])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def test_a_gpu_with_mig_on_offers_its_instances_not_itself(mig: FakeNvml) -> None:
    gpus = detect_gpus()
    assert [(g.index, g.uuid, g.parent, g.memory_bytes) for g in gpus] == [
        (0, UUIDS[0], None, 141 << 30),
        (2, "MIG-first-aaaa", 1, 18 << 30),  # numbered after the machine's two GPUs
        (3, "MIG-second-bbbb", 1, 35 << 30),
    ]
    assert gpus[2].model == "NVIDIA H200 2g.35gb"


@pytest.mark.parametrize(
    ("mask", "offered"),
    [
        ("1", [2, 3]),  # the GPU: all its instances
        ("MIG-second", [3]),
        ("MIG-GPU-mig0-aaaa/3/0", [2]),  # the older form
        (f"GPU-mig0-aaaa,{UUIDS[0]}", [0, 2, 3]),
    ],
)
def test_a_mask_names_mig_instances(
    mig: FakeNvml, monkeypatch: pytest.MonkeyPatch, mask: str, offered: list[int]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
    assert [g.index for g in local_node().gpus] == offered


def test_memory_of_a_process_on_a_mig_instance_counts_on_that_instance(mig: FakeNvml) -> None:
    nvml = Nvml.open()
    assert nvml is not None
    try:
        values, by_pid = nvml.sample()
        assert by_pid == {1_000_001: {3: 2 << 30}, 1_000_002: {2: 1 << 30}}
        assert nvml.holders([2, 0]) == {2: {1_000_002}, 0: set()}
        # a MIG GPU has no device-wide utilization: absent, not 0; its memory is sampled
        assert (names.GPU_UTIL, 1) not in {(n, g) for n, _, g in values}
        assert (names.FB_USED, 1) in {(n, g) for n, _, g in values}
    finally:
        nvml.close()


def test_only_the_gpus_of_the_mask_are_sampled(nvml: FakeNvml) -> None:
    opened = Nvml.open(["2"])
    assert opened is not None
    try:
        values, _ = opened.sample()
        assert {g for _, _, g in values} == {2}
    finally:
        opened.close()


# -- per-job GPU memory across PID namespaces (item 8) -------------------------------------
def test_nspids_reads_a_process_pid_in_every_nested_namespace(tmp_path: Path) -> None:
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "status").write_text("Name:\tpython\nNSpid:\t41\t7\t1\nUid:\t0\n")
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text("Name:\tpython\n")  # a kernel without NSpid
    assert nspids(41, tmp_path) == [41, 7, 1]
    assert nspids(42, tmp_path) == [42]
    assert nspids(43, tmp_path) == [43]  # gone


def test_a_job_process_is_matched_under_the_pid_of_a_nested_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML may give a rank's PID in the namespace the rank runs in (a container inside the
    server's): the sampler matches it through NSpid."""
    fake = FakeNvml([FakeGpu(UUIDS[0], processes=[FakeProcess(7, 3 << 30)])])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    import trainhouse.monitoring.sampler as sampler_module

    me = os.getpid()
    monkeypatch.setattr(sampler_module, "nspids", lambda pid: [pid, 7] if pid == me else [pid])
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        job_id = new_job(store)
        samples = Sampler(store.system, FakeExecutor(job_pids={job_id: [me]}), node="n").sample()
        job = {(s.name, s.gpu): s.value for s in samples if s.job_id == job_id}
        assert job[(names.GPU_MEMORY, 0)] == 3 << 30
    finally:
        store.close()


def test_memory_of_pids_the_server_cannot_see_counts_for_the_job_holding_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server in a container without the host's PID namespace: NVML gives host PIDs that do
    not exist for it. Their memory counts for the job the GPU is allocated to."""
    host_pid = 999_999_991  # no such process here
    fake = FakeNvml(
        [
            FakeGpu(UUIDS[0], processes=[FakeProcess(host_pid, 5 << 30)]),
            FakeGpu(UUIDS[1], processes=[FakeProcess(host_pid + 1, 1 << 30)]),  # unallocated
        ]
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        job_id = new_job(store)
        sampler = Sampler(
            store.system,
            FakeExecutor(job_pids={job_id: [os.getpid()]}),
            node="n",
            allocations=lambda: {job_id: [0]},
        )
        samples = sampler.sample()
        job = {(s.name, s.gpu): s.value for s in samples if s.job_id == job_id}
        assert job[(names.GPU_MEMORY, 0)] == 5 << 30
        assert (names.GPU_MEMORY, 1) not in job
    finally:
        store.close()


# -- a GPU is offered once free (item 7); a job names its GPU by UUID (6); caches (10) ------
LEFTOVER_AWARE_JOB = """\
import os, pathlib, sys
cache = pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
attempt = os.environ["TRAINHOUSE_ATTEMPT"]
print("visible", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["CUDA_DEVICE_ORDER"],
      "attempt", attempt, "kept", (cache / "kernel").exists(), flush=True)
cache.mkdir(parents=True, exist_ok=True)
(cache / "kernel").write_text("compiled")
sys.exit(1 if attempt == "1" else 0)
"""


def test_a_gpu_an_ended_attempt_still_holds_waits_until_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank of an ended attempt (stuck in the kernel, say) still holds GPU 0: a job that needs
    it waits, saying why, instead of starting into an out-of-memory failure, and starts once the
    process is gone. The job sees its GPU by UUID in PCI bus order, and its compilers' cache
    is kept from its failed first attempt to its second, then removed with the job."""
    from trainhouse.executors.gpu_release import GpuRelease
    from trainhouse.jobfs.layout import MARKER_ENV, JobLayout

    home = tmp_path / "home"
    home_id = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        env={**os.environ, MARKER_ENV: f"{home_id}:99:1"},  # job 99's first attempt
    )
    gpu = FakeGpu(UUIDS[0], processes=[FakeProcess(leftover.pid, 20 << 30)])
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gpu]).module())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("trainhouse.executors.gpu_release.CHECK_EVERY", 0.0)
    try:
        with app_client(tmp_path, real=True, gpus=None) as api:
            assert services(api).scheduler.executor.capacity()[0].gpus[0].uuid == UUIDS[0]
            spec = "entrypoint: python train.py\nresources: {gpus_per_node: 1}\nmax_restarts: 1\n"
            job = submit(api, spec, workdir(tmp_path, LEFTOVER_AWARE_JOB)).json()
            deadline = time.monotonic() + 30
            while "held by process" not in (
                api.get(f"/api/v1/jobs/{job['id']}").json()["reason"] or ""
            ):
                assert time.monotonic() < deadline, api.get(f"/api/v1/jobs/{job['id']}").json()
                time.sleep(0.1)
            shown = api.get(f"/api/v1/jobs/{job['id']}").json()
            assert shown["state"] == "QUEUED"
            assert (
                f"GPU 0 is still held by process {leftover.pid} of job 99's attempt 1"
                in (shown["reason"])
            )
            (node,) = api.get("/api/v1/nodes").json()["nodes"]
            assert node["free_gpus"] == [] and "held by process" in node["held"][0]

            leftover.kill()
            leftover.wait()
            gpu.processes.clear()
            final = wait_state(api, job["id"], {"COMPLETED", "FAILED"}, timeout=120)
            assert final["state"] == "COMPLETED", final
            log = api.get(f"/api/v1/jobs/{job['id']}/logs").text
            assert f"visible {UUIDS[0]} PCI_BUS_ID attempt 1 kept False" in log, log
            assert f"visible {UUIDS[0]} PCI_BUS_ID attempt 2 kept True" in log, log
            assert not JobLayout(home, job["id"]).cache.exists()
    finally:
        leftover.kill()
        leftover.wait()
    assert GpuRelease  # imported for the reader: the module that holds GPUs back


def test_only_processes_of_ended_attempts_of_this_server_hold_a_gpu_back() -> None:
    from trainhouse.executors.gpu_release import GpuRelease

    class Holders:
        def holders(self, gpus: object) -> dict[int, set[int]]:
            return {0: {10}, 1: {11}, 2: {12}, 3: {13}}

        def close(self) -> None:
            pass

    markers = {10: "me:5:2", 11: "me:6:1", 12: "other:5:1", 13: None}
    release = GpuRelease("me", open_nvml=lambda: Holders(), read_marker=markers.get)  # type: ignore[arg-type,return-value]
    node = Node("n", 8, 1 << 30, tuple(Gpu(i, uuid=f"GPU-{i}") for i in range(4)))
    held = release.held(node, running={"me:6:1"})
    # job 6's attempt 1 runs (its GPU is the scheduler's business); another server's process
    # and a process of nobody's are not trainhouse's to judge
    assert list(held) == [0]
    assert "process 10 of job 5's attempt 2" in held[0]
    declared = Node("n", 8, 1 << 30, (Gpu(0),))
    assert release.held(declared, running=set()) == {}  # declared GPUs: no NVML to ask


def test_top_shows_why_a_gpu_is_held_back() -> None:
    from rich.console import Console

    from trainhouse.cli.top import render

    node = {
        "name": "gpu-box",
        "cpus": 32,
        "memory_bytes": 1 << 40,
        "gpus": [{"index": 0, "uuid": UUIDS[0]}],
        "free_cpus": 32,
        "free_gpus": [],
        "held": ["GPU 0 is still held by process 4242 of job 7's attempt 1, which has ended"],
        "gpus_live": [{"index": 0, "util": 0.0, "fb_used": 20480.0, "power": 90.0, "temp": 40.0}],
        "sampled_at": None,
    }
    console = Console(record=True, width=200)
    console.print(render({"nodes": [node], "jobs": []}))
    assert "held by process 4242 of job 7's attempt 1" in console.export_text()
