"""The MLflow-compatible API (/mlflow, trainhouse.server.mlflow) in process: its wire format,
MLflow's limits, tracked runs listed with the jobs, a job's own scope, who may do what, the
origin rule for a client that sends no X-Trainhouse-Request, and hostile artifact paths.

The real mlflow client against a real server: tests/integration/test_bring_your_own.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import app_client, services, wait_launched, workdir
from tests.support.fakes import FakeExecutor
from tests.support.team import Team, make_team
from trainhouse.jobfs.layout import JobEnv

API = "/mlflow/api/2.0/mlflow"
ARTIFACTS = "/mlflow/api/2.0/mlflow-artifacts/artifacts"


@pytest.fixture
def mlflow_api(tmp_path: Path) -> Iterator[TestClient]:
    """The app in process, asked as the mlflow client asks: no X-Trainhouse-Request header, no
    Origin, no Sec-Fetch-Site."""
    with app_client(tmp_path, exit_code=None) as api:
        yield TestClient(api.app, base_url="http://127.0.0.1")


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    yield from make_team(tmp_path)


def mlflow_error(resp: Any, status: int, code: str) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert body["error_code"] == code, body
    return str(body["message"])


def new_run(api: TestClient, **extra: Any) -> str:
    resp = api.post(f"{API}/runs/create", json={"experiment_id": "0", **extra})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["run"]["info"]["run_id"])


def test_experiments_default_create_and_missing(mlflow_api: TestClient) -> None:
    api = mlflow_api
    default = api.get(f"{API}/experiments/get-by-name", params={"experiment_name": "Default"})
    assert default.json()["experiment"]["experiment_id"] == "0"
    assert api.get(f"{API}/experiments/get", params={"experiment_id": "0"}).status_code == 200
    missing = api.get(f"{API}/experiments/get-by-name", params={"experiment_name": "mnist"})
    mlflow_error(missing, 404, "RESOURCE_DOES_NOT_EXIST")
    made = api.post(f"{API}/experiments/create", json={"name": "mnist"}).json()["experiment_id"]
    found = api.get(f"{API}/experiments/get-by-name", params={"experiment_name": "mnist"})
    assert found.json()["experiment"] == {
        **found.json()["experiment"],
        "experiment_id": made,
        "name": "mnist",
        "lifecycle_stage": "active",
    }
    again = api.post(f"{API}/experiments/create", json={"name": "mnist"})
    mlflow_error(again, 400, "RESOURCE_ALREADY_EXISTS")
    mlflow_error(
        api.get(f"{API}/experiments/get", params={"experiment_id": "77"}),
        404,
        "RESOURCE_DOES_NOT_EXIST",
    )
    mlflow_error(
        api.get(f"{API}/experiments/get", params={"experiment_id": "x'"}),
        404,
        "RESOURCE_DOES_NOT_EXIST",
    )
    mlflow_error(
        api.post(f"{API}/experiments/create", json={"name": "x" * 501}),
        400,
        "INVALID_PARAMETER_VALUE",
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"{API}/runs/search"),
        ("POST", f"{API}/runs/search"),
        ("POST", f"{API}/runs/delete"),
        ("GET", f"{API}/runs/create"),  # a known route, another method
        ("POST", "/mlflow/api/2.0/mlflow/model-versions/create"),
        ("POST", "/mlflow/jobs/1/api/2.0/mlflow/registered-models/create"),
        ("DELETE", f"{ARTIFACTS}/runs/1/a.txt"),
        ("GET", "/mlflow/ajax-api/2.0/mlflow/experiments/search"),
    ],
)
def test_unknown_routes_are_endpoint_not_found(
    mlflow_api: TestClient, method: str, path: str
) -> None:
    resp = mlflow_api.request(method, path, json={})
    mlflow_error(resp, 404, "ENDPOINT_NOT_FOUND")


def test_malformed_requests_are_4xx_naming_the_field(mlflow_api: TestClient) -> None:
    api = mlflow_api
    run = new_run(api)
    bad = api.post(
        f"{API}/runs/log-metric", content=b"{not json", headers={"content-type": "application/json"}
    )
    mlflow_error(bad, 400, "MALFORMED_REQUEST")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"key": "m", "value": "lots", "timestamp": 1, "step": 0}, "'value'"),
        ({"key": "m", "value": 1.0, "timestamp": 1, "step": -1}, "'step'"),
        ({"key": "m", "value": 1.0, "timestamp": 1, "step": "1e3"}, "'step'"),
        ({"key": "", "value": 1.0, "timestamp": 1}, "'key'"),
        ({"key": "../up", "value": 1.0, "timestamp": 1}, "'key'"),
        ({"key": "k" * 251, "value": 1.0, "timestamp": 1}, "'key'"),
        ({"key": "a\x00b", "value": 1.0, "timestamp": 1}, "NUL"),
    ]
    for body, named in cases:
        resp = api.post(f"{API}/runs/log-metric", json={"run_id": run, **body})
        assert named in mlflow_error(resp, 400, "INVALID_PARAMETER_VALUE"), body
    for run_id in ("abc", "-1", "99999"):
        resp = api.post(f"{API}/runs/log-metric", json={"run_id": run_id, "key": "m", "value": 1})
        mlflow_error(resp, 404, "RESOURCE_DOES_NOT_EXIST")


def test_a_tracked_run_is_listed_with_the_jobs_and_ended_by_update(
    mlflow_api: TestClient,
) -> None:
    api = mlflow_api
    run = new_run(
        api,
        run_name="laptop run #1",
        user_id="ada",
        start_time="1700000000000",  # protobuf JSON writes an int64 as a string
        tags=[{"key": "mlflow.source.name", "value": "train.py"}],
    )
    metrics = [
        {"key": "train/loss", "value": 0.5, "timestamp": "1700000001000", "step": "1"},
        {"key": "train/loss", "value": "NaN", "timestamp": 1700000002000, "step": 2},
        {"key": "train/loss", "value": "Infinity", "timestamp": 1700000003000, "step": 3},
        {"key": "train/loss", "value": 0.25, "timestamp": 1700000004000, "step": 1},  # again
        {"key": "acc", "value": 1, "timestamp": 1700000004000},  # no step: 0
    ]
    resp = api.post(
        f"{API}/runs/log-batch",
        json={
            "run_id": run,
            "metrics": metrics,
            "params": [{"key": "lr", "value": "0.1"}, {"key": "layers", "value": "4"}],
            "tags": [{"key": "team", "value": "vision"}],
        },
    )
    assert resp.status_code == 200 and resp.json() == {}, resp.text
    assert (
        api.post(
            f"{API}/runs/log-parameter", json={"run_id": run, "key": "lr", "value": "0.1"}
        ).status_code
        == 200
    )
    changed = api.post(f"{API}/runs/log-parameter", json={"run_id": run, "key": "lr", "value": "1"})
    assert "keeps its first value" in mlflow_error(changed, 400, "INVALID_PARAMETER_VALUE")
    assert (
        api.post(
            f"{API}/runs/set-tag", json={"run_id": run, "key": "team", "value": "nlp"}
        ).status_code
        == 200
    )
    history = api.get(
        f"{API}/metrics/get-history", params={"run_id": run, "metric_key": "train/loss"}
    )
    assert history.json()["metrics"] == [
        {"key": "train/loss", "value": 0.25, "timestamp": 1700000004000, "step": 1},
        {"key": "train/loss", "value": "NaN", "timestamp": 1700000002000, "step": 2},
        {"key": "train/loss", "value": "NaN", "timestamp": 1700000003000, "step": 3},
    ]
    got = api.get(f"{API}/runs/get", params={"run_id": run}).json()["run"]
    assert got["info"]["status"] == "RUNNING" and got["info"]["run_name"] == "laptop run #1"
    assert got["info"]["start_time"] == 1700000000000
    assert got["info"]["artifact_uri"] == f"mlflow-artifacts:/runs/{run}"
    assert {p["key"]: p["value"] for p in got["data"]["params"]} == {"lr": "0.1", "layers": "4"}
    assert {t["key"]: t["value"] for t in got["data"]["tags"]}["team"] == "nlp"
    listed = api.get("/api/v1/jobs", headers={"X-Trainhouse-Request": "1"}).json()["jobs"]
    (job,) = [j for j in listed if str(j["id"]) == run]
    assert job["kind"] == "tracked" and job["state"] == "RUNNING" and job["owner"] == "ada"
    assert job["name"] == "laptop-run-1"
    ended = api.post(
        f"{API}/runs/update", json={"run_id": run, "status": "FINISHED", "end_time": 1700000009000}
    )
    assert ended.json()["run_info"]["status"] == "FINISHED"
    assert ended.json()["run_info"]["end_time"] == 1700000009000
    detail = api.get(f"/api/v1/jobs/{run}").json()
    assert detail["state"] == "COMPLETED" and detail["kind"] == "tracked"
    assert detail["params"] == {"layers": "4", "lr": "0.1"}
    assert detail["mlflow_tags"]["team"] == "nlp"
    # params are the hparams the run reports: in the runs table, as numbers
    assert detail["hparams"] == {"layers": 4, "lr": 0.1}
    found = api.get(
        "/api/v1/jobs",
        params={"where": "hparams.lr >= 0.05 and hparams.layers = 4", "columns": "hparams.lr"},
    ).json()
    assert [(str(j["id"]), j["values"]) for j in found["jobs"]] == [(run, {"hparams.lr": 0.1})]
    assert detail["latest_metrics"]["acc"] == 1.0
    # the scheduler never saw it: no launch
    fake = services(api).scheduler.executor
    assert isinstance(fake, FakeExecutor) and fake.launches == []
    failed = new_run(api)
    api.post(f"{API}/runs/update", json={"run_id": failed, "status": "FAILED"})
    assert api.get(f"/api/v1/jobs/{failed}").json()["state"] == "FAILED"
    bad = api.post(f"{API}/runs/update", json={"run_id": failed, "status": "DONE"})
    mlflow_error(bad, 400, "INVALID_PARAMETER_VALUE")


def test_log_batch_keeps_mlflows_limits(mlflow_api: TestClient) -> None:
    api = mlflow_api
    run = new_run(api)
    metric = {"key": "m", "value": 1.0, "timestamp": 1, "step": 0}
    cases = [
        ({"metrics": [metric] * 1001}, "at most 1000 metrics"),
        ({"params": [{"key": f"p{i}", "value": "1"} for i in range(101)]}, "at most 100 params"),
        ({"tags": [{"key": f"t{i}", "value": "1"} for i in range(101)]}, "at most 100 tags"),
        (
            {"metrics": [metric] * 1000, "params": [{"key": "p", "value": "1"}]},
            "at most 1000 metrics, params, and tags in total",
        ),
        ({"params": [{"key": "p", "value": "x" * 6001}]}, "exceeded length limit of 6000"),
        ({"tags": [{"key": "t", "value": "x" * 8001}]}, "exceeded length limit of 8000"),
        ({"metrics": "m"}, "must be a list of objects"),
    ]
    for body, says in cases:
        resp = api.post(f"{API}/runs/log-batch", json={"run_id": run, **body})
        assert says in mlflow_error(resp, 400, "INVALID_PARAMETER_VALUE"), says
    full = {
        "metrics": [{**metric, "step": i} for i in range(900)],
        "params": [{"key": f"p{i}", "value": "v"} for i in range(50)],
        "tags": [{"key": f"t{i}", "value": "v"} for i in range(50)],
    }
    assert api.post(f"{API}/runs/log-batch", json={"run_id": run, **full}).status_code == 200
    history = api.get(f"{API}/metrics/get-history", params={"run_id": run, "metric_key": "m"})
    assert [m["step"] for m in history.json()["metrics"]] == list(range(900))
    # nothing of a refused batch was stored
    assert services(api).store.tracking.values(int(run), "param") == {
        f"p{i}": "v" for i in range(50)
    }


def test_params_merged_into_hparams_keep_the_reports_cap(mlflow_api: TestClient) -> None:
    """MLflow params become the run's reported hparams; the SDK's reports cap those at 64 KiB
    of JSON, and the params that would pass it are refused whole (nothing of them stored)."""
    api = mlflow_api
    run = new_run(api)
    batch = [{"key": f"a{i}", "value": "x" * 5000} for i in range(10)]  # 50 KB
    assert (
        api.post(f"{API}/runs/log-batch", json={"run_id": run, "params": batch}).status_code == 200
    )
    more = [{"key": f"b{i}", "value": "y" * 5000} for i in range(4)]  # 70 KB in all
    said = mlflow_error(
        api.post(f"{API}/runs/log-batch", json={"run_id": run, "params": more}),
        400,
        "INVALID_PARAMETER_VALUE",
    )
    assert "at most 64 KiB as JSON" in said and "params" in said
    store = services(api).store
    assert sorted(store.tracking.values(int(run), "param")) == [f"a{i}" for i in range(10)]
    assert sorted(store.jobs.get(int(run)).hparams or {}) == [f"a{i}" for i in range(10)]


def test_history_comes_in_pages_and_each_metric_at_its_own_step(mlflow_api: TestClient) -> None:
    """get-history pages (max_results, next_page_token, as the mlflow client asks): every
    point once, never downsampled; runs/get gives each metric its own latest step, not the
    job's."""
    api = mlflow_api
    run = new_run(api)
    for first in range(0, 2500, 1000):
        metrics = [
            {"key": "loss", "value": 1.0 / (s + 1), "timestamp": 1000 + s, "step": s}
            for s in range(first, min(first + 1000, 2500))
        ]
        resp = api.post(f"{API}/runs/log-batch", json={"run_id": run, "metrics": metrics})
        assert resp.status_code == 200, resp.text
    acc = [{"key": "acc", "value": 0.5, "timestamp": 1, "step": s} for s in range(10)]
    assert api.post(f"{API}/runs/log-batch", json={"run_id": run, "metrics": acc}).is_success

    shown = api.get(f"{API}/runs/get", params={"run_id": run}).json()["run"]["data"]["metrics"]
    assert {m["key"]: m["step"] for m in shown} == {"acc": 9, "loss": 2499}

    url = f"{API}/metrics/get-history"
    steps: list[int] = []
    token: str | None = None
    pages = 0
    while True:
        params = {"run_id": run, "metric_key": "loss", "max_results": 1000}
        got = api.get(url, params={**params, **({"page_token": token} if token else {})}).json()
        steps += [m["step"] for m in got["metrics"]]
        pages += 1
        token = got.get("next_page_token")
        if token is None:
            break
    assert pages == 3 and steps == list(range(2500))
    whole = api.get(url, params={"run_id": run, "metric_key": "loss"}).json()
    assert len(whole["metrics"]) == 2500 and "next_page_token" not in whole
    for bad in ({"max_results": 0}, {"max_results": 100_001}, {"page_token": "../1"}):
        resp = api.get(url, params={"run_id": run, "metric_key": "loss", **bad})
        mlflow_error(resp, 400, "INVALID_PARAMETER_VALUE")


def test_a_jobs_own_scope_makes_every_run_the_job(mlflow_api: TestClient, tmp_path: Path) -> None:
    """Inside a job, MLflow's variables point at the job's scope with its credential: runs/create
    returns the job itself (clients that ignore MLFLOW_RUN_ID land there), params become the
    job's reported hparams, metrics its series; nobody else writes there, not even with auth off."""
    api = mlflow_api
    headers = {"X-Trainhouse-Request": "1"}
    spec = "name: mlflow-job\nentrypoint: python train.py\nenv: {MLFLOW_EXPERIMENT_NAME: mine}\n"
    resp = api.post(
        "/api/v1/jobs",
        data={"spec": spec, "owner": "tester"},
        files={"workdir": ("w.tar.gz", workdir(tmp_path), "application/gzip")},
        headers=headers,
    )
    job_id = resp.json()["id"]
    in_process = TestClient(api.app, base_url="http://127.0.0.1", headers=headers)
    wait_launched(in_process, job_id)
    fake = services(api).scheduler.executor
    assert isinstance(fake, FakeExecutor)
    env = fake.launches[0].env.on_node(tmp_path / "logs", tmp_path / "attempt").to_env()
    assert env["MLFLOW_TRACKING_URI"].endswith(f"/mlflow/jobs/{job_id}")
    assert env["MLFLOW_RUN_ID"] == str(job_id)
    assert env["MLFLOW_TRACKING_TOKEN"] == fake.launches[0].env.token
    assert env["TRAINHOUSE_TENSORBOARD_DIR"] == str(tmp_path / "tensorboard")
    assert JobEnv.from_env(env) == fake.launches[0].env.on_node(
        tmp_path / "logs", tmp_path / "attempt"
    )
    scope = f"/mlflow/jobs/{job_id}/api/2.0/mlflow"
    auth = {"Authorization": f"Bearer {env['MLFLOW_TRACKING_TOKEN']}"}
    # mlflow.set_experiment("mine") then start_run(): the job's run moves to that experiment
    missing = api.get(
        f"{scope}/experiments/get-by-name", params={"experiment_name": "mine"}, headers=auth
    )
    mlflow_error(missing, 404, "RESOURCE_DOES_NOT_EXIST")
    exp = api.post(f"{scope}/experiments/create", json={"name": "mine"}, headers=auth).json()
    made = api.post(
        f"{scope}/runs/create",
        json={"experiment_id": exp["experiment_id"], "run_name": "r"},
        headers=auth,
    )
    info = made.json()["run"]["info"]
    assert info["run_id"] == str(job_id) and info["experiment_id"] == exp["experiment_id"]
    logged = api.post(
        f"{scope}/runs/log-batch",
        json={
            "run_id": str(job_id),
            "params": [{"key": "lr", "value": "0.01"}],
            "metrics": [
                {"key": "loss", "value": 1 / (s + 1), "timestamp": 1, "step": s} for s in range(5)
            ],
        },
        headers=auth,
    )
    assert logged.status_code == 200, logged.text
    # the global scope with the job's credential reaches the same job, and only it
    assert api.get(f"{API}/runs/get", params={"run_id": job_id}, headers=auth).status_code == 200
    other = new_run(api)
    mlflow_error(
        api.get(f"{API}/runs/get", params={"run_id": other}, headers=auth),
        404,
        "RESOURCE_DOES_NOT_EXIST",
    )
    mlflow_error(
        api.post(
            f"{scope}/runs/log-metric", json={"run_id": other, "key": "m", "value": 1}, headers=auth
        ),
        404,
        "RESOURCE_DOES_NOT_EXIST",
    )
    # without the credential: reads as the job's readers, no writes (auth off too)
    assert api.get(f"{scope}/runs/get", params={"run_id": job_id}).status_code == 200
    mlflow_error(
        api.post(f"{scope}/runs/log-metric", json={"run_id": str(job_id), "key": "m", "value": 1}),
        401,
        "UNAUTHENTICATED",
    )
    mlflow_error(
        api.post(f"{API}/runs/log-metric", json={"run_id": str(job_id), "key": "m", "value": 1}),
        403,
        "PERMISSION_DENIED",
    )
    wrong = {"Authorization": f"Bearer thj_{job_id}_not-the-secret"}
    mlflow_error(
        api.post(
            f"{scope}/runs/log-metric",
            json={"run_id": str(job_id), "key": "m", "value": 1},
            headers=wrong,
        ),
        401,
        "UNAUTHENTICATED",
    )
    detail = in_process.get(f"/api/v1/jobs/{job_id}").json()
    assert detail["params"] == {"lr": "0.01"} and detail["kind"] == "launched"
    assert detail["state"] == "RUNNING" and detail["last_step"] == 4
    ended = api.post(
        f"{scope}/runs/update", json={"run_id": str(job_id), "status": "FINISHED"}, headers=auth
    )
    assert ended.status_code == 200
    assert in_process.get(f"/api/v1/jobs/{job_id}").json()["state"] == "RUNNING"  # the scheduler's


def test_origin_rule_for_the_mlflow_client(mlflow_api: TestClient) -> None:
    """The mlflow client sends no X-Trainhouse-Request: a write without any browser's sign, or
    with a bearer token, passes under /mlflow; a cross-site browser write is refused there as
    everywhere; the rest of the API keeps its rule."""
    api = mlflow_api
    assert api.post(f"{API}/experiments/create", json={"name": "plain"}).status_code == 200
    bearer = {"Authorization": "Bearer anything", "Origin": "https://evil.example"}
    assert (
        api.post(f"{API}/experiments/create", json={"name": "b"}, headers=bearer).status_code == 200
    )
    for headers in (
        {"Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ):
        resp = api.post(f"{API}/experiments/create", json={"name": "x"}, headers=headers)
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "cross_origin", headers
        put = api.put(f"{ARTIFACTS}/runs/1/x.txt", content=b"x", headers=headers)
        assert put.status_code == 403, headers
    own = {"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"}
    assert (
        api.post(f"{API}/experiments/create", json={"name": "own"}, headers=own).status_code == 200
    )
    # the rest of the API: no header, no browser sign, still refused
    assert api.post("/api/v1/jobs/1/cancel").status_code == 403
    assert api.post("/api/v1/mlflow/api/2.0/mlflow/experiments/create", json={}).status_code == 403


def test_roles_follow_the_team(team: Team) -> None:
    api = team.api
    plain = TestClient(api.app, base_url="http://127.0.0.1")

    def as_(user: str | None) -> dict[str, str]:
        return team.h(user) if user else {}

    mlflow_error(
        plain.get(f"{API}/experiments/get", params={"experiment_id": "0"}), 401, "UNAUTHENTICATED"
    )
    refused = plain.post(f"{API}/runs/create", json={"experiment_id": "0"}, headers=as_("vera"))
    mlflow_error(refused, 403, "PERMISSION_DENIED")
    mlflow_error(
        plain.post(f"{API}/experiments/create", json={"name": "e"}, headers=as_("vera")),
        403,
        "PERMISSION_DENIED",
    )
    made = plain.post(
        f"{API}/runs/create",
        json={"experiment_id": "0", "user_id": "mallory"},
        headers=as_("alice"),
    )
    run = made.json()["run"]["info"]["run_id"]
    assert made.json()["run"]["info"]["user_id"] == "alice"  # with auth on, the token says who
    metric = {"run_id": run, "key": "m", "value": 1.0, "timestamp": 1, "step": 0}
    assert (
        plain.post(f"{API}/runs/log-metric", json=metric, headers=as_("alice")).status_code == 200
    )
    mlflow_error(
        plain.post(f"{API}/runs/log-metric", json=metric, headers=as_("bob")),
        403,
        "PERMISSION_DENIED",
    )
    mlflow_error(
        plain.get(f"{API}/runs/get", params={"run_id": run}, headers=as_("bob")),
        403,
        "PERMISSION_DENIED",
    )
    assert plain.post(f"{API}/runs/log-metric", json=metric, headers=as_("root")).status_code == 200
    assert (
        plain.get(f"{API}/runs/get", params={"run_id": run}, headers=as_("alice")).status_code
        == 200
    )
    mlflow_error(
        plain.get(
            f"{API}/runs/get", params={"run_id": run}, headers={"Authorization": "Bearer thu_wrong"}
        ),
        401,
        "UNAUTHENTICATED",
    )
    listed = team.get("alice", "/jobs").json()["jobs"]
    assert [(j["id"], j["kind"]) for j in listed] == [(int(run), "tracked")]
    # a member's launched job is written by its own script only
    job = team.submit("alice", "launched").json()["id"]
    mlflow_error(
        plain.post(
            f"{API}/runs/log-metric", json={**metric, "run_id": str(job)}, headers=as_("alice")
        ),
        403,
        "PERMISSION_DENIED",
    )
    ended = plain.post(
        f"{API}/runs/update", json={"run_id": run, "status": "KILLED"}, headers=as_("alice")
    )
    assert ended.status_code == 200
    assert team.get("alice", f"/jobs/{run}").json()["state"] == "CANCELED"


def test_artifacts_round_trip_and_hostile_paths(mlflow_api: TestClient, tmp_path: Path) -> None:
    api = mlflow_api
    run = new_run(api)
    root = f"{ARTIFACTS}/runs/{run}"
    assert api.put(f"{root}/model/weights.bin", content=b"\x00\x01" * 1000).status_code == 200
    assert api.put(f"{root}/notes.txt", content=b"hello").status_code == 200
    assert api.put(f"{root}/notes.txt", content=b"hello again").status_code == 200  # replaced
    assert api.get(f"{root}/notes.txt").content == b"hello again"
    assert api.get(f"{root}/model/weights.bin").content == b"\x00\x01" * 1000
    listing = api.get(ARTIFACTS, params={"path": f"runs/{run}"}).json()["files"]
    assert listing == [
        {"path": "model", "is_dir": True},
        {"path": "notes.txt", "is_dir": False, "file_size": 11},
    ]
    one = api.get(ARTIFACTS, params={"path": f"runs/{run}/notes.txt"}).json()["files"]
    assert one == [{"path": "notes.txt", "is_dir": False, "file_size": 11}]
    assert api.get(ARTIFACTS, params={"path": f"runs/{run}/nothing"}).json()["files"] == []
    for path in ("..%2F..%2Fsecrets", "a/../../b", "a/%2E%2E/%2E%2E/b", "a\\b"):
        resp = api.put(f"{root}/{path}", content=b"x")
        assert resp.status_code in (400, 404), (path, resp.text)
    mlflow_error(
        api.get(f"{ARTIFACTS}/runs/{run}/%2E%2E/1/notes.txt"), 400, "INVALID_PARAMETER_VALUE"
    )
    mlflow_error(api.get(f"{ARTIFACTS}/elsewhere/x"), 404, "RESOURCE_DOES_NOT_EXIST")
    mlflow_error(api.get(f"{root}/missing.txt"), 404, "RESOURCE_DOES_NOT_EXIST")
    mlflow_error(api.put(f"{root}/model", content=b"x"), 400, "INVALID_PARAMETER_VALUE")
    # what a job's processes could leave in its directory: a link out, a FIFO
    files = services(api).files(int(run)).artifacts
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    (files / "link.txt").symlink_to(outside)
    os.mkfifo(files / "fifo")
    (files / "dirlink").symlink_to(tmp_path)
    # refused by their artifact path: the server's own paths are not shown to the caller
    home = str(services(api).settings.home)
    for resp, shown in (
        (api.get(f"{root}/link.txt"), "artifact link.txt refused: it is a symbolic link"),
        (api.get(f"{root}/fifo"), "artifact fifo refused: it is not a regular file"),
        (
            api.put(f"{root}/dirlink/planted.txt", content=b"x"),
            "artifact dirlink/planted.txt refused: it is a symbolic link",
        ),
    ):
        mlflow_error(resp, 400, "INVALID_PARAMETER_VALUE")
        assert resp.json()["message"].startswith(shown), resp.text
        assert home not in resp.text and str(tmp_path) not in resp.text
    assert not (tmp_path / "planted.txt").exists()
    assert api.put(f"{root}/link.txt", content=b"mine").status_code == 200  # replaces the link
    assert outside.read_text() == "secret" and api.get(f"{root}/link.txt").content == b"mine"
    names = [f["path"] for f in api.get(ARTIFACTS, params={"path": f"runs/{run}"}).json()["files"]]
    assert "fifo" not in names and "dirlink" not in names


def test_artifact_size_caps(tmp_path: Path) -> None:
    with app_client(tmp_path, mlflow_artifact_bytes=1000, mlflow_run_artifact_bytes=1500) as api:
        plain = TestClient(api.app, base_url="http://127.0.0.1")
        run = new_run(plain)
        root = f"{ARTIFACTS}/runs/{run}"
        assert plain.put(f"{root}/a", content=b"x" * 1000).status_code == 200
        too_big = plain.put(f"{root}/b", content=b"x" * 1001)
        assert too_big.status_code == 413
        over_run = plain.put(f"{root}/c", content=b"x" * 600)
        assert "would pass 1500 bytes" in mlflow_error(over_run, 413, "INVALID_PARAMETER_VALUE")

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(30):
                yield b"y" * 100

        streamed = plain.put(f"{root}/d", content=chunks())
        assert streamed.status_code == 413
        names = [
            f["path"] for f in plain.get(ARTIFACTS, params={"path": f"runs/{run}"}).json()["files"]
        ]
        assert names == ["a"]  # nothing half-written left behind
