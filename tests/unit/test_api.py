"""The REST API in process (starlette TestClient runs the real app and its scheduler loop),
over the suite's fake executor; the tests about what real ranks do run the local executor."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.api import error_of, in_process, submit, wait_state, workdir
from trainhouse.core.tokens import hash_token
from trainhouse.server import Settings, create_app


def test_health_and_nodes(api: TestClient) -> None:
    assert api.get("/api/v1/health").json()["status"] == "ok"
    nodes = api.get("/api/v1/nodes").json()
    assert nodes["nodes"][0]["cpus"] == 2 and nodes["nodes"][0]["gpus"] == []


def test_openapi_lists_contract(api: TestClient) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    for path in (
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/cancel",
        "/api/v1/jobs/{job_id}/metrics",
        "/api/v1/jobs/{job_id}/logs",
        "/api/v1/jobs/{job_id}/checkpoints",
        "/api/v1/jobs/{job_id}/report",
    ):
        assert path in paths


def test_job_runs_to_completion(real_api: TestClient, tmp_path: Path) -> None:
    api = real_api
    resp = submit(api, "name: hello\nentrypoint: python train.py", workdir(tmp_path))
    assert resp.status_code == 201, resp.text
    job = wait_state(api, resp.json()["id"], {"COMPLETED", "FAILED"})
    assert job["state"] == "COMPLETED", job
    assert job["owner"] == "tester"
    assert job["attempt_history"][0]["rank_exit_codes"] == {"0": 0}
    log = api.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": 0})
    assert "hello from rank" in log.text
    assert int(log.headers["X-Log-Offset"]) == len(log.content)
    listed = api.get("/api/v1/jobs", params={"all": "true"}).json()["jobs"]
    assert [j["id"] for j in listed] == [job["id"]]
    assert api.get("/api/v1/jobs").json()["jobs"] == []  # ended jobs hidden by default


def test_failing_job_reports_rank_and_log_tail(real_api: TestClient, tmp_path: Path) -> None:
    api = real_api
    script = "import sys\nprint('about to fail')\nsys.exit(3)\n"
    resp = submit(api, "entrypoint: python train.py", workdir(tmp_path, script))
    job = wait_state(api, resp.json()["id"], {"COMPLETED", "FAILED"})
    assert job["state"] == "FAILED"
    assert job["exit_code"] == 3
    assert "rank 0 exited with code 3" in job["reason"]
    assert "about to fail" in job["reason"]


@pytest.mark.parametrize(
    ("spec", "status", "code", "needle"),
    [
        ("entrypoint: python train.py\nbogus: 1", 422, "invalid_spec", "unknown key 'bogus'"),
        (
            "entrypoint: python train.py\nresources: {procs_per_node: 0}",
            422,
            "invalid_spec",
            "resources.procs_per_node",
        ),
        (
            "entrypoint: python train.py\nresources: {procs_per_node: 64}",
            422,
            "unschedulable",
            "largest node offers 2 CPU cores",
        ),
        (
            "entrypoint: python train.py\nresources: {gpus_per_node: 1}",
            422,
            "unschedulable",
            "no GPUs",
        ),
        (
            "entrypoint: python missing.py",
            422,
            "invalid_archive",
            "entrypoint file 'missing.py' is not in the uploaded workdir",
        ),
    ],
)
def test_bad_submissions(
    api: TestClient, tmp_path: Path, spec: str, status: int, code: str, needle: str
) -> None:
    resp = submit(api, spec, workdir(tmp_path))
    assert resp.status_code == status
    err = error_of(resp)
    assert err["code"] == code and needle in err["message"], err
    assert api.get("/api/v1/jobs", params={"all": "true"}).json()["jobs"] == []


def test_malformed_archive(api: TestClient) -> None:
    resp = submit(api, "entrypoint: python train.py", b"not a tarball")
    assert resp.status_code == 422
    assert "not a valid .tar.gz" in error_of(resp)["message"]


def test_missing_form_fields(api: TestClient) -> None:
    resp = api.post("/api/v1/jobs", data={"spec": "entrypoint: a"})
    assert resp.status_code == 422
    assert "workdir" in error_of(resp)["message"]


def test_unknown_job_everywhere(api: TestClient) -> None:
    for method, path in [
        ("GET", "/jobs/42"),
        ("POST", "/jobs/42/cancel"),
        ("GET", "/jobs/42/metrics"),
        ("GET", "/jobs/42/logs"),
        ("GET", "/jobs/42/checkpoints"),
    ]:
        resp = api.request(method, f"/api/v1{path}")
        assert resp.status_code == 404, path
        assert error_of(resp)["message"] == "job 42 does not exist"
    resp = api.post("/api/v1/jobs/42/report", json={"batch_id": "b", "attempt": 1, "points": []})
    assert resp.status_code == 404


def test_report_needs_the_jobs_credential(api: TestClient, tmp_path: Path) -> None:
    job = submit(api, "entrypoint: python train.py", workdir(tmp_path)).json()
    body = {"batch_id": "b", "attempt": 1, "points": [[0, "loss", 1.0, None, 0.0]]}
    resp = api.post(f"/api/v1/jobs/{job['id']}/report", json=body)
    assert resp.status_code == 401
    resp = api.post(
        f"/api/v1/jobs/{job['id']}/report", json=body, headers={"Authorization": "Bearer forged"}
    )
    assert resp.status_code == 401
    assert "not valid" in error_of(resp)["message"]
    wait_state(api, job["id"], {"COMPLETED", "FAILED"})


def test_malformed_report(api: TestClient, tmp_path: Path) -> None:
    job = submit(api, "entrypoint: python train.py", workdir(tmp_path)).json()
    wait_state(api, job["id"], {"COMPLETED", "FAILED"})
    # a stranger learns nothing about the payload rules: credentials are checked first
    resp = api.post(f"/api/v1/jobs/{job['id']}/report", json={"points": "nope"})
    assert resp.status_code == 401
    services = api.app.state.runtime  # type: ignore[attr-defined]
    services.store.jobs.update(job["id"], token_hash=hash_token("known"))
    auth = {"Authorization": "Bearer known"}
    for body in (
        {"points": "nope"},
        {"batch_id": "b", "attempt": 0, "points": []},
        {"batch_id": "b", "attempt": 1, "points": [[0, "loss"]]},
    ):
        resp = api.post(f"/api/v1/jobs/{job['id']}/report", json=body, headers=auth)
        assert resp.status_code == 422, body
        assert error_of(resp)["code"] == "invalid_request"
    body = {
        "batch_id": "b",
        "attempt": 1,
        "points": [[0, "loss", None, None, 1.0], [1, "loss", 0.5, None, 2.0]],
    }
    resp = api.post(f"/api/v1/jobs/{job['id']}/report", json=body, headers=auth)
    assert resp.json() == {"accepted": 2, "stop": False, "stop_reason": None}
    series = api.get(f"/api/v1/jobs/{job['id']}/metrics").json()["series"]
    assert series[0]["points"] == [[0, None, 1.0], [1, 0.5, 2.0]]


def test_cancel_ended_job_is_a_conflict(api: TestClient, tmp_path: Path) -> None:
    job = submit(api, "entrypoint: python train.py", workdir(tmp_path)).json()
    wait_state(api, job["id"], {"COMPLETED"})
    resp = api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert resp.status_code == 409
    assert "already ended" in error_of(resp)["message"]


def test_unknown_route_is_json(api: TestClient) -> None:
    resp = api.get("/api/v1/nope")
    assert resp.status_code == 404 and error_of(resp)["code"] == "not_found"


def test_bad_query_values(api: TestClient, tmp_path: Path) -> None:
    job = submit(api, "entrypoint: python train.py", workdir(tmp_path)).json()
    resp = api.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": "../../etc/passwd"})
    assert resp.status_code == 422
    resp = api.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": "5"})
    assert resp.status_code == 404
    assert error_of(resp)["message"] == f"job {job['id']} has ranks 0..0; there is no rank 5"
    wait_state(api, job["id"], {"COMPLETED", "FAILED"})


def test_declared_gpus_are_placed_concretely(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", port=1, cpus=4, gpus="2", tick=0.1)
    script = (
        "import os, time\n"
        "print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
        "time.sleep(1.5)\n"
    )
    spec = "entrypoint: python train.py\nresources: {gpus_per_node: 1}"
    with in_process(create_app(settings)) as api:  # the real executor: real ranks
        ids = [submit(api, spec, workdir(tmp_path, script)).json()["id"] for _ in range(3)]
        jobs = [wait_state(api, i, {"COMPLETED", "FAILED"}) for i in ids]
        assert [j["state"] for j in jobs] == ["COMPLETED"] * 3
        gpus = [j["placement"]["nodes"][0]["gpus"] for j in jobs]
        assert sorted(gpus[:2]) == [[0], [1]]  # the first two ran side by side
        for job, g in zip(jobs, gpus, strict=True):
            log = api.get(f"/api/v1/jobs/{job['id']}/logs").text
            assert f"CVD={g[0]}" in log
        # the third waited until a GPU was free
        assert jobs[2]["started_at"] >= min(j["ended_at"] for j in jobs[:2]) - 0.5


def test_scheduler_endpoints_refuse_bad_input(api: TestClient, tmp_path: Path) -> None:
    resp = api.post("/api/v1/jobs/dry-run", data={"spec": "entrypoint: a\nresources: {x: 1}"})
    assert resp.status_code == 422 and "unknown key 'resources.x'" in error_of(resp)["message"]
    resp = api.post(
        "/api/v1/jobs/dry-run", data={"spec": "entrypoint: a\nresources: {procs_per_node: 99}"}
    )
    assert resp.status_code == 422 and error_of(resp)["code"] == "unschedulable"
    plan = api.post("/api/v1/jobs/dry-run", data={"spec": "entrypoint: a"}).json()
    assert plan["would_start"] and plan["placement"][0]["cpus"] == 1
    assert api.get("/api/v1/jobs", params={"all": "true"}).json()["jobs"] == []  # nothing made

    resp = api.post("/api/v1/jobs/7/priority", json={"priority": "high"})
    assert resp.status_code == 404
    job = submit(api, "entrypoint: python train.py", workdir(tmp_path)).json()
    resp = api.post(f"/api/v1/jobs/{job['id']}/priority", json={"priority": "top"})
    assert resp.status_code == 422
    wait_state(api, job["id"], {"COMPLETED"})
    resp = api.post(f"/api/v1/jobs/{job['id']}/priority", json={"priority": "high"})
    assert resp.status_code == 409 and "only a queued job" in error_of(resp)["message"]

    for body in ({"max_gpus": -1}, {"share": 0}, {"max_cpus": "many"}):
        resp = api.put("/api/v1/quotas/alice", json=body)
        assert resp.status_code == 422, body
    assert api.put("/api/v1/quotas/alice", json={"max_gpus": 2}).json()["max_gpus"] == 2
    kept = api.put("/api/v1/quotas/alice", json={"share": 3}).json()
    assert (kept["max_gpus"], kept["share"]) == (2, 3.0)
    assert api.delete("/api/v1/quotas/alice").status_code == 204
    assert api.delete("/api/v1/quotas/alice").status_code == 404
    assert api.get("/api/v1/queue").json() == {"jobs": [], "preempting": []}


def test_report_bounds_and_checkpoint_paths(api: TestClient, tmp_path: Path) -> None:
    """Regression: oversized names and steps were 500s that blocked a job's reporting, and
    './x.pt' and 'x.pt' were two records for one file."""
    job = submit(api, "entrypoint: python train.py", workdir(tmp_path)).json()
    wait_state(api, job["id"], {"COMPLETED"})
    services = api.app.state.runtime  # type: ignore[attr-defined]
    services.store.jobs.update(job["id"], token_hash=hash_token("known"))
    auth = {"Authorization": "Bearer known"}
    url = f"/api/v1/jobs/{job['id']}"
    for point in (
        [0, "x" * 257, 1.0, None, 0.0],
        [2**63, "loss", 1.0, None, 0.0],
        [0, "loss", 1.0, -3, 0.0],
    ):
        body = {"batch_id": "b", "attempt": 1, "points": [point]}
        assert api.post(f"{url}/report", json=body, headers=auth).status_code == 422
    ckpt_dir = Path(api.get(f"{url}/checkpoints").json()["directory"])
    (ckpt_dir / "x.pt").write_bytes(b"abc")
    for path in ("./x.pt", "x.pt"):
        body = {"attempt": 1, "step": 1, "path": path, "size": 3, "sha256": "0" * 64}
        resp = api.post(f"{url}/checkpoints", json=body, headers=auth)
        assert resp.status_code == 201 and resp.json()["path"] == "x.pt"
    assert len(api.get(f"{url}/checkpoints").json()["checkpoints"]) == 1
    body = {"attempt": 1, "step": 1, "path": "../../x.pt", "size": 3, "sha256": "0" * 64}
    resp = api.post(f"{url}/checkpoints", json=body, headers=auth)
    assert resp.status_code == 422 and "must not climb out" in error_of(resp)["message"]
