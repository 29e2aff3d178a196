"""Resource monitoring end to end: a real server sampling a real job's torchrun ranks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.jobs import LONG_SCRIPT, write_job
from tests.support.servers import Server, assert_clean_stop, start_server

pytestmark = pytest.mark.integration


@pytest.fixture
def sampling_server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "home", "--cpus", "4", "--monitor-interval", "0.5")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def test_a_running_job_is_sampled_and_shown_by_top(sampling_server: Server, tmp_path: Path) -> None:
    server = sampling_server
    spec = write_job(
        tmp_path,
        LONG_SCRIPT,
        """
        name: sampled
        entrypoint: python train.py
        resources: {procs_per_node: 2}
        """,
    )
    job_id = server.cli_json("submit", str(spec), "--detach")["id"]
    server.wait_step(job_id, 3)

    # the job's processes (supervisor, torchrun, 2 ranks) show up in its system series
    deadline = time.monotonic() + 120
    with server.client as c:
        while True:
            series = {s["name"]: s for s in c.job_system(job_id)["series"]}
            procs = [v for _, v in series.get("processes", {"points": []})["points"]]
            if procs and max(procs) >= 4:
                break
            assert time.monotonic() < deadline, f"job {job_id} never sampled whole: {series}"
            time.sleep(0.3)
        assert min(v for _, v in series["rss_bytes"]["points"]) > 0
        assert max(v for _, v in series["rss_bytes"]["points"]) > 100 * 2**20  # torch in ranks
        assert "gpu_memory_bytes" not in series  # no GPU here
        node = c.nodes()["nodes"][0]
        assert node["sampled_at"] is not None and node["memory_used_bytes"] > 0
        assert node["gpus_live"] == []
        node_series = c.node_metrics(node["name"], names=["cpu_percent"], since=-600)["series"]
        assert [s["name"] for s in node_series] == ["cpu_percent"] and node_series[0]["points"]

    top = server.cli_json("top")
    assert [n["name"] for n in top["nodes"]] == [node["name"]]
    assert top["nodes"][0]["cpu_percent"] is not None
    (job,) = top["jobs"]
    assert job["id"] == job_id and job["state"] == "RUNNING" and job["step"] >= 3
    assert job["rss_bytes"] > 0 and job["processes"] >= 1 and job["gpu_memory_bytes"] == {}

    frame = server.cli("top", "--once")
    assert frame.returncode == 0, frame.stderr
    assert node["name"] in frame.stdout and "sampled" in frame.stdout
    assert "RUNNING" in frame.stdout and "MiB" in frame.stdout

    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("trainhouse_jobs", (("state", "RUNNING"),))] == 1
    assert samples[("trainhouse_cpus", (("node", node["name"]), ("state", "allocated")))] == 2
    assert samples[("trainhouse_job_rss_bytes", (("job_id", str(job_id)),))] > 0
    assert samples[("trainhouse_metric_points_ingested_total", ())] > 0

    result = server.cli("cancel", str(job_id))
    assert result.returncode == 0, result.stderr
    server.wait(job_id, {"CANCELED"})
    assert server.cli_json("top")["jobs"] == []
