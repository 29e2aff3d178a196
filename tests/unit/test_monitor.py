"""Resource monitoring: the sampler (real psutil, a fake NVML), the system_metrics store on
SQLite and PostgreSQL, the API endpoints, and the Prometheus exposition."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.api import in_process
from tests.support.fakes import FakeExecutor
from tests.support.nvml import FakeGpu, FakeNvml, FakeProcess
from tests.support.records import new_job as make_job
from trainhouse.core import metricnames as names
from trainhouse.core.cluster import Node
from trainhouse.core.tokens import hash_token
from trainhouse.executors.local import LocalExecutor
from trainhouse.executors.node.markers import marked_pids
from trainhouse.jobfs.workdir import pack
from trainhouse.monitoring.sampler import Nvml, Sampler
from trainhouse.monitoring.telemetry import Telemetry
from trainhouse.server import Settings, create_app
from trainhouse.store import Store
from trainhouse.store.system import Sample

DAY = 86400.0


# a job that never fits: a running scheduler leaves it queued
NEVER_FITS = {"entrypoint": "python train.py", "resources": {"cpus_per_proc": 4096}}


def new_job(store: Store, priority: str = "normal") -> int:
    return make_job(store, owner="u", priority=priority, spec=NEVER_FITS)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    """A real process that used some CPU and holds ~64 MB resident."""
    code = (
        "import sys, time\n"
        "data = bytearray(b'x') * 64_000_000\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.2: pass\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def by_name(
    samples: list[Sample], job_id: int | None = None
) -> dict[tuple[str, int | None], float]:
    return {(s.name, s.gpu): s.value for s in samples if s.job_id == job_id}


# -- the sampler ---------------------------------------------------------------------------
def test_sampler_stores_node_and_job_samples(tmp_path: Path, child: subprocess.Popen[str]) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        job_id = new_job(store)
        system = store.system
        sampler = Sampler(system, FakeExecutor(job_pids={job_id: [child.pid]}), node="n1")
        first = sampler.tick()
        second = sampler.tick()
        for samples in (first, second):
            node = by_name(samples)
            assert 0.0 <= node[(names.CPU_PERCENT, None)] <= 100.0
            assert node[(names.MEMORY_TOTAL, None)] == psutil.virtual_memory().total
            assert 0 < node[(names.MEMORY_USED, None)] < node[(names.MEMORY_TOTAL, None)]
            job = by_name(samples, job_id)
            assert job[(names.PROCESSES, None)] == 1
            assert job[(names.RSS, None)] >= 60_000_000
            assert job[(names.CPU_PERCENT, None)] >= 0
        assert by_name(first, job_id)[(names.CPU_PERCENT, None)] > 0  # it spun before
        # no GPU on this machine: no GPU part at all, never zeros
        assert Nvml.open() is None
        assert not [s for s in first + second if s.gpu is not None or s.name.startswith("DCGM")]

        latest = system.latest(node="n1")
        assert latest is not None and latest.gpus() == []
        assert latest.value(names.MEMORY_TOTAL) == psutil.virtual_memory().total
        assert {s.name for s in latest.samples} == {
            names.CPU_PERCENT,
            names.MEMORY_USED,
            names.MEMORY_TOTAL,
        }
        job_latest = system.latest(job_id=job_id)
        assert job_latest is not None and job_latest.at == latest.at
        assert job_latest.value(names.RSS) == by_name(second, job_id)[(names.RSS, None)]
        series = {s.name: s for s in system.series(job_id=job_id)}
        assert set(series) == {names.CPU_PERCENT, names.RSS, names.PROCESSES}
        assert len(series[names.RSS].points) == 2
    finally:
        store.close()


def test_a_job_without_live_processes_has_no_sample(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        job_id = new_job(store)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        executor = FakeExecutor(job_pids={job_id: [gone.pid]})
        samples = Sampler(store.system, executor, node="n").sample()
        assert by_name(samples, job_id) == {}
    finally:
        store.close()


def fake_pynvml(pid: int) -> types.ModuleType:
    """Two GPUs; GPU 1 does not report power. ``pid`` uses memory on both."""
    return FakeNvml(
        [
            FakeGpu(
                f"GPU-{h}",
                memory=80 << 30,
                used=(10 + h) << 30,
                util=90 + h,
                power_mw=250_500 if h == 0 else None,
                temp=60 + h,
                processes=[
                    FakeProcess(pid, (h + 1) << 30),
                    FakeProcess(999_999_999, 1 << 30),  # someone else's, in another namespace
                    FakeProcess(pid + 1, None),  # not available
                ],
            )
            for h in range(2)
        ]
    ).module()


def test_gpu_samples_follow_dcgm_names_and_count_memory_by_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(os.getpid()))
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        job_id = new_job(store)
        system = store.system
        sampler = Sampler(system, FakeExecutor(job_pids={job_id: [os.getpid()]}), node="g")
        samples = sampler.tick()
        sampler.stop()
        node = by_name(samples)
        assert node[(names.GPU_UTIL, 0)] == 90 and node[(names.GPU_UTIL, 1)] == 91
        assert node[(names.FB_USED, 0)] == 10 * 1024 and node[(names.FB_FREE, 1)] == 69 * 1024
        assert node[(names.POWER_USAGE, 0)] == 250.5
        assert (names.POWER_USAGE, 1) not in node  # not supported: absent, not 0
        assert node[(names.GPU_TEMP, 1)] == 61
        job = by_name(samples, job_id)
        assert job[(names.GPU_MEMORY, 0)] == 1 << 30 and job[(names.GPU_MEMORY, 1)] == 2 << 30

        latest = system.latest(node="g")
        assert latest is not None and latest.gpus() == [0, 1]
        assert latest.value(names.GPU_TEMP, 0) == 60
    finally:
        store.close()


def test_no_driver_means_no_gpu_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_pynvml(os.getpid())

    def no_driver() -> None:
        raise nv.NVMLError("Driver Not Loaded")  # type: ignore[attr-defined]

    nv.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    assert Nvml.open() is None
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        samples = Sampler(store.system, FakeExecutor(), node="n").sample()
        assert samples and all(s.gpu is None for s in samples)
    finally:
        store.close()


def test_sampler_thread_samples_until_stopped(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        system = store.system
        off = Sampler(system, FakeExecutor(), node="n", interval=0)
        off.start()
        assert off._thread is None
        off.stop()
        sampler = Sampler(system, FakeExecutor(), node="n", interval=0.05)
        sampler.start()
        wait_for(
            lambda: (
                [len(s.points) >= 3 for s in system.series(node="n", names=["cpu_percent"])]
                == [True]
            ),
            "the sampler did not sample three times",
        )
        sampler.stop()
        assert sampler._thread is None
    finally:
        store.close()


def test_retention_deletes_old_samples_only(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        system = store.system
        now = time.time()
        for age in (10 * DAY, 8 * DAY):
            system.write("n", now - age, [Sample(names.CPU_PERCENT, 1.0)])
        system.write("n", now - DAY, [Sample(names.CPU_PERCENT, 2.0)])
        sampler = Sampler(system, FakeExecutor(), node="n", retention=7 * DAY)
        sampler.tick()
        points = system.series(node="n", names=[names.CPU_PERCENT], since=0)[0].points
        assert len(points) == 2 and points[0] == (pytest.approx(now - DAY), 2.0)
        # checked every few minutes, not at every sample
        system.write("n", now - 9 * DAY, [Sample(names.CPU_PERCENT, 3.0)])
        sampler.tick()
        assert len(system.series(node="n", names=[names.CPU_PERCENT], since=0)[0].points) == 4
        sampler._purged_at -= sampler.retention_every
        sampler.tick()
        assert len(system.series(node="n", names=[names.CPU_PERCENT], since=0)[0].points) == 4
    finally:
        store.close()


# -- the store, on SQLite and PostgreSQL -----------------------------------------------------
def test_series_raw_and_downsampled(store: Store) -> None:
    system = store.system
    job_id = new_job(store)
    t0 = 1_000_000.0
    for i in range(100):
        system.write(
            "a",
            t0 + i,
            [
                Sample(names.CPU_PERCENT, float(i)),
                Sample(names.GPU_UTIL, float(i % 10), gpu=0),
                Sample(names.GPU_UTIL, 50.0, gpu=1),
                Sample(names.RSS, 1000.0 + i, job_id=job_id),
                Sample(names.MEMORY_USED, float("nan")),  # not finite: not stored
            ],
        )
    system.write("b", t0, [Sample(names.CPU_PERCENT, 99.0)])

    raw = system.series(node="a", since=t0 + 10, until=t0 + 19)
    assert [(s.name, s.gpu) for s in raw] == [
        (names.GPU_UTIL, 0),
        (names.GPU_UTIL, 1),
        (names.CPU_PERCENT, None),
    ]
    cpu = raw[2]
    assert cpu.points == [(t0 + i, float(i)) for i in range(10, 20)] and cpu.max == [
        float(i) for i in range(10, 20)
    ]

    down = system.series(node="a", names=[names.CPU_PERCENT, names.GPU_UTIL], max_points=10)
    assert all(len(s.points) == 10 for s in down)
    gpu0 = next(s for s in down if s.gpu == 0)
    assert gpu0.points[0] == (pytest.approx(t0 + 4.5), pytest.approx(4.5))
    assert gpu0.max == [9.0] * 10
    cpu = next(s for s in down if s.name == names.CPU_PERCENT)
    assert cpu.points[-1] == (pytest.approx(t0 + 94.5), pytest.approx(94.5))
    assert cpu.max[-1] == 99.0
    assert len(system.series(node="a", names=[names.CPU_PERCENT], max_points=7)[0].points) <= 7

    job = system.series(job_id=job_id, max_points=1)
    assert [s.name for s in job] == [names.RSS]
    assert job[0].points == [(pytest.approx(t0 + 49.5), pytest.approx(1049.5))]
    assert job[0].max == [1099.0]
    assert system.series(node="nowhere") == []
    assert system.latest(node="nowhere") is None and system.latest(job_id=job_id + 1) is None
    with pytest.raises(ValueError):
        system.series()


def test_purge_in_batches_and_job_counts(store: Store) -> None:
    system = store.system
    job_id = new_job(store, priority="high")
    new_job(store)
    for i in range(25):
        system.write("a", float(i), [Sample(names.RSS, 1.0, job_id=job_id)])
    assert system.purge(20.0, batch=3) == 20
    assert len(system.series(job_id=job_id)[0].points) == 5
    assert system.jobs_by_state()["QUEUED"] == 2 and system.jobs_by_state()["RUNNING"] == 0
    assert system.queued_by_priority() == {"high": 1, "normal": 1}


# -- the local executor's PIDs ---------------------------------------------------------------
def test_marked_pids_finds_processes_by_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = LocalExecutor(Node("n", 1, 1 << 30), tmp_path)
    monkeypatch.setenv("TRAINHOUSE_RUN_MARKER", "test-marker-" + os.urandom(4).hex())
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    try:
        assert marked_pids()[os.environ["TRAINHOUSE_RUN_MARKER"]] == [proc.pid]
        assert executor.pids(12345) == []  # no such attempt
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()


# -- the API and /metrics --------------------------------------------------------------------
@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        home=tmp_path / "home", port=1, cpus=2, gpus="0", tick=0.1, monitor_interval=0.2
    )
    with in_process(create_app(settings)) as client:
        yield client


def services(api: TestClient) -> Any:
    return api.app.state.runtime  # type: ignore[attr-defined]


def scrape(api: TestClient) -> dict[str, list[Any]]:
    resp = api.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    families: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(resp.text):
        families.setdefault(family.name, []).extend(family.samples)
    return families


def value(families: dict[str, list[Any]], name: str, **labels: str) -> float:
    """The one sample called ``name`` with ``labels``, in whichever family holds it."""
    found = [
        s.value
        for samples in families.values()
        for s in samples
        if s.name == name and s.labels == labels
    ]
    assert len(found) == 1, (name, labels, found)
    return float(found[0])


def wait_for(check: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_nodes_show_the_latest_sample(api: TestClient) -> None:
    node = wait_for(
        lambda: (n := api.get("/api/v1/nodes").json()["nodes"][0])["sampled_at"] and n,
        "no sample reached /nodes",
    )
    assert 0 <= node["cpu_percent"] <= 100
    assert 0 < node["memory_used_bytes"] < node["memory_bytes"] * 2
    assert node["gpus_live"] == []  # no GPU here

    name = node["name"]
    series = api.get(f"/api/v1/nodes/{name}/metrics").json()["series"]
    assert {s["name"] for s in series} == {
        names.CPU_PERCENT,
        names.MEMORY_USED,
        names.MEMORY_TOTAL,
    }
    assert all(s["gpu"] is None and s["points"] for s in series)
    only = api.get(
        f"/api/v1/nodes/{name}/metrics", params={"name": names.MEMORY_TOTAL, "since": -3600}
    ).json()["series"]
    assert [s["name"] for s in only] == [names.MEMORY_TOTAL]
    resp = api.get("/api/v1/nodes/nowhere/metrics")
    assert resp.status_code == 404 and name in resp.json()["error"]["message"]
    assert api.get(f"/api/v1/nodes/{name}/metrics?max_points=0").status_code == 422

    # what a GPU node would show, stored as the sampler would
    services(api).monitor.stop()  # nothing newer from now on
    services(api).store.system.write(
        name,
        time.time(),
        [
            Sample(names.CPU_PERCENT, 12.5),
            Sample(names.MEMORY_USED, 1e9),
            Sample(names.GPU_UTIL, 97.0, gpu=0),
            Sample(names.FB_USED, 1024.0, gpu=0),
            Sample(names.GPU_TEMP, 70.0, gpu=0),
        ],
    )
    node = api.get("/api/v1/nodes").json()["nodes"][0]
    assert node["cpu_percent"] == 12.5 and node["memory_used_bytes"] == 10**9
    assert node["gpus_live"] == [
        {"index": 0, "util": 97.0, "fb_used": 1024.0, "power": None, "temp": 70.0}
    ]
    families = scrape(api)
    assert value(families, names.GPU_UTIL, node=name, gpu="0") == 97.0
    assert value(families, names.FB_USED, node=name, gpu="0") == 1024.0
    assert names.POWER_USAGE not in families


def test_job_system_series(api: TestClient) -> None:
    rt = services(api)
    job_id = new_job(rt.store)
    t0 = time.time() - 100
    for i in range(50):
        rt.store.system.write("n", t0 + i, [Sample(names.RSS, float(i), job_id=job_id)])
    body = api.get(f"/api/v1/jobs/{job_id}/system").json()
    assert body == {
        "series": [
            {
                "name": names.RSS,
                "gpu": None,
                "points": [[t0 + i, float(i)] for i in range(50)],
                "max": [float(i) for i in range(50)],
            }
        ]
    }
    down = api.get(f"/api/v1/jobs/{job_id}/system", params={"max_points": 5}).json()
    assert len(down["series"][0]["points"]) == 5 and down["series"][0]["max"][-1] == 49.0
    recent = api.get(f"/api/v1/jobs/{job_id}/system", params={"since": -60}).json()
    values = [v for _, v in recent["series"][0]["points"]]  # at >= the server's now - 60
    assert 5 <= len(values) <= 10 and values == [float(i) for i in range(50 - len(values), 50)]
    assert api.get("/api/v1/jobs/999/system").status_code == 404


def test_prometheus_exposition(api: TestClient, tmp_path: Path) -> None:
    src = tmp_path / "wd"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    job = api.post(
        "/api/v1/jobs",
        data={"spec": "entrypoint: python train.py", "owner": "tester"},
        files={"workdir": ("w.tar.gz", pack(src).data, "application/gzip")},
    ).json()
    wait_for(
        lambda: api.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "COMPLETED",
        "the job did not complete",
        timeout=120,
    )
    rt = services(api)
    rt.store.jobs.update(job["id"], token_hash=hash_token("known"))
    body = {
        "batch_id": "b",
        "attempt": 1,
        "points": [[i, "loss", 1.0, None, 1.0] for i in range(3)],
    }
    resp = api.post(
        f"/api/v1/jobs/{job['id']}/report", json=body, headers={"Authorization": "Bearer known"}
    )
    assert resp.json()["accepted"] == 3
    wait_for(lambda: scrape(api).get("trainhouse_node_cpu_percent"), "no node sample exposed")

    families = scrape(api)
    node = rt.scheduler.executor.nodes()[0].name
    assert value(families, "trainhouse_jobs", state="COMPLETED") == 1
    assert value(families, "trainhouse_jobs", state="FAILED") == 0
    for tier in ("low", "normal", "high", "urgent"):
        assert value(families, "trainhouse_queue_length", priority=tier) >= 0
    assert value(families, "trainhouse_gpus", node=node, state="free") == 0
    assert value(families, "trainhouse_gpus", node=node, state="allocated") == 0
    assert value(families, "trainhouse_cpus", node=node, state="free") == 2
    assert value(families, "trainhouse_cpus", node=node, state="allocated") == 0
    assert value(families, "trainhouse_metric_points_ingested_total") == 3
    decisions = {s.name: s.value for s in families["trainhouse_scheduler_decision_seconds"]}
    assert decisions["trainhouse_scheduler_decision_seconds_count"] >= 1
    assert decisions["trainhouse_scheduler_decision_seconds_sum"] > 0
    assert 0 <= value(families, "trainhouse_node_cpu_percent", node=node) <= 100
    assert value(families, "trainhouse_node_memory_used_bytes", node=node) > 0
    assert value(families, "trainhouse_node_memory_total_bytes", node=node) > 0
    # GPU-less: no DCGM names at all; nothing else from prometheus_client's global registry
    assert not [n for n in families if n.startswith("DCGM") or n.startswith("process_")]


def test_two_apps_have_their_own_registries(tmp_path: Path) -> None:
    apps = [
        in_process(create_app(Settings(home=tmp_path / f"h{i}", port=1, monitor_interval=0)))
        for i in range(2)
    ]
    with apps[0] as a, apps[1] as b:
        services(a).telemetry.points.inc(5)
        assert value(scrape(a), "trainhouse_metric_points_ingested_total") == 5
        assert value(scrape(b), "trainhouse_metric_points_ingested_total") == 0
        # sampling off: no node gauges, only their names
        assert scrape(b)["trainhouse_node_cpu_percent"] == []


def test_collector_counts_jobs_and_queue(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        for priority in ("high", "normal", "normal"):
            new_job(store, priority)
        telemetry = Telemetry()
        executor = FakeExecutor()
        telemetry.watch(store, store.system, executor, stale_after=15)
        families: dict[str, list[Any]] = {}
        for family in text_string_to_metric_families(telemetry.render().decode()):
            families[family.name] = family.samples
        assert value(families, "trainhouse_jobs", state="QUEUED") == 3
        assert value(families, "trainhouse_jobs", state="RUNNING") == 0
        assert value(families, "trainhouse_queue_length", priority="normal") == 2
        assert value(families, "trainhouse_queue_length", priority="high") == 1
        assert value(families, "trainhouse_queue_length", priority="low") == 0
        assert value(families, "trainhouse_cpus", node="fake", state="free") == 4
        assert value(families, "trainhouse_scheduler_decision_seconds_count") == 0
    finally:
        store.close()
