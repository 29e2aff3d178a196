"""``POST /api/v1/jobs/{id}/checkpoints`` on its lean path (``trainhouse.server.registrations``),
through the real app in process: every request answers as the FastAPI route answers it (the
same app with the lean path off), well formed or not, signed or not; the origin guard and the
body limit still hold; a registration with its points is one transaction of the group commit
writer, whose points are never lost to a refused checkpoint and never outlived by a record
whose insert failed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.support.api import (
    CROSS_SITE,
    app_client,
    cross_origin,
    error_of,
    page_request,
    services,
    submit,
    wait_launched,
    workdir,
)
from trainhouse.core.lifecycle import JobState
from trainhouse.core.records import Job
from trainhouse.core.spec import JobSpec
from trainhouse.core.tokens import hash_token
from trainhouse.server.app import API
from trainhouse.server.limits import DEFAULT_LIMIT
from trainhouse.server.schemas import CheckpointRegisteredOut
from trainhouse.usecases.runtime import Runtime

SECRET = "thj_the-job-credential"
AUTH = {"Authorization": f"Bearer {SECRET}"}
WEIGHTS = b"weights!"
DIGEST = hashlib.sha256(WEIGHTS).hexdigest()


def columns(*steps: int) -> dict[str, list[Any]]:
    return {
        "step": list(steps),
        "name": ["loss"] * len(steps),
        "value": [1.0 / (s + 1) for s in steps],
        "rank": [None] * len(steps),
        "wall_time": [1.0] * len(steps),
    }


def checkpoint(step: int = 1, **extra: Any) -> dict[str, Any]:
    body = {
        "attempt": 1,
        "step": step,
        "path": "c.pt",
        "size": len(WEIGHTS),
        "sha256": DIGEST,
        "metrics": {"val_loss": 0.5},
    }
    return body | extra


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[TestClient, Runtime, int]]:
    """The app (auth off; a job RUNNING, its credential SECRET, ``c.pt`` in its checkpoints)."""
    with app_client(tmp_path, exit_code=None, auth_failures=1000) as api:
        made = submit(api, "entrypoint: python train.py", workdir(tmp_path)).json()
        wait_launched(api, made["id"])
        rt = services(api)
        rt.store.jobs.update(made["id"], token_hash=hash_token(SECRET))
        directory = Path(rt.checkpoints.location(made["id"]))
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "c.pt").write_bytes(WEIGHTS)
        yield api, rt, made["id"]


def lean(api: TestClient) -> API:
    app = api.app
    assert isinstance(app, API) and app.registrations is not None
    return app


def both(api: TestClient, send: Any) -> tuple[httpx.Response, httpx.Response]:
    """``send(api)`` answered by the lean path, then by the route (the lean path off)."""
    app = lean(api)
    fast = send(api)
    kept, app.registrations = app.registrations, None
    try:
        routed = send(api)
    finally:
        app.registrations = kept
    return fast, routed


def same(fast: httpx.Response, routed: httpx.Response) -> Any:
    """The two answers alike but for the new record's id and time; the lean one's body."""
    assert fast.status_code == routed.status_code, (fast.text, routed.text)
    assert fast.headers["content-type"] == routed.headers["content-type"]
    a, b = fast.json(), routed.json()
    for body in (a, b):
        if fast.status_code == 201:
            body.pop("id"), body.pop("created_at")
    assert a == b
    return a


def test_a_registration_answers_as_the_route_does(job: tuple[TestClient, Runtime, int]) -> None:
    api, rt, job_id = job
    url = f"/api/v1/jobs/{job_id}/checkpoints"
    routed_calls = []
    app = lean(api)
    original = app.routed

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        routed_calls.append(scope["path"])
        await original(scope, receive, send)

    app.routed = counted  # type: ignore[method-assign]
    before = rt.reports.transactions
    alone = same(*both(api, lambda a: a.post(url, json=checkpoint(), headers=AUTH)))
    assert alone["report"] is None and alone["path"] == "c.pt" and alone["job_id"] == job_id
    assert alone["metrics"] == {"val_loss": 0.5}
    # each: the credential, the storage check and the record in one of the writer's
    assert rt.reports.transactions == before + 2
    assert routed_calls == []  # the lean path answered it, not the route
    batches = iter(["b1", "b2"])

    def with_report(a: TestClient) -> httpx.Response:
        report = {"batch_id": next(batches), "attempt": 1, "columns": columns(0, 1)}
        return a.post(url, json=checkpoint(report=report | {"total_steps": 10}), headers=AUTH)

    with_points = same(*both(api, with_report))
    assert with_points["report"] == {"accepted": 2, "stop": False, "stop_reason": None}
    assert routed_calls == []
    # 20 digits in a row (here a digest's): left to the route, whose answer is the same
    same(*both(api, lambda a: a.post(url, json=checkpoint(sha256="0" * 64), headers=AUTH)))
    assert len(routed_calls) == 1
    # the same batch id again (the route's try, then a retry): stored once
    report = {"batch_id": "b1", "attempt": 1, "columns": columns(0, 1)}
    again = same(*both(api, lambda a: a.post(url, json=checkpoint(report=report), headers=AUTH)))
    assert again["report"]["accepted"] == 0
    series = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"name": "loss"}).json()["series"]
    assert sorted(p[0] for p in series[0]["points"]) == [0, 1]
    listed = api.get(url).json()["checkpoints"]
    assert len(listed) == 1  # the same path again replaces it


def test_refusals_answer_as_the_route_does(job: tuple[TestClient, Runtime, int]) -> None:
    """A bad credential, none, a job that is not there, malformed JSON, a body the route's
    model refuses, a report its parser refuses (before and after the credential), a checkpoint
    storage refuses: the same status and body either way."""
    api, _, job_id = job
    url = f"/api/v1/jobs/{job_id}/checkpoints"
    wrong = {"Authorization": "Bearer thj_guess"}
    bad_report = {"batch_id": "b", "attempt": 1, "columns": {"step": [0]}}
    big = b'{"batch_id": "b", "attempt": 1, "columns": {"step": [0], "name": ["loss"], '
    big += b'"value": [18446744073709551616], "rank": [null], "wall_time": [1.0]}}'
    with_big = json.dumps(checkpoint()).encode()[:-1] + b', "report": ' + big + b"}"
    plain = json.dumps(checkpoint())

    def post(where: str = url, headers: dict[str, str] = AUTH, **kwargs: Any) -> Any:
        return lambda a: a.post(where, headers=headers, **kwargs)

    cases: list[tuple[str, Any, int]] = [
        ("wrong credential", post(json=checkpoint(), headers=wrong), 401),
        ("no credential", post(json=checkpoint(), headers={}), 401),
        ("no such job", post("/api/v1/jobs/9999/checkpoints", json=checkpoint()), 404),
        ("malformed JSON", post(content=b'{"attempt": 1,'), 422),
        ("a list", post(content=b"[]"), 422),
        ("empty", post(content=b""), 422),
        ("bad digest", post(json=checkpoint(sha256="x")), 422),
        (
            "not JSON's type",
            post(content=plain, headers=AUTH | {"Content-Type": "text/plain"}),
            422,
        ),
        ("bad report", post(json=checkpoint(report=bad_report)), 422),
        (
            "bad report, wrong credential",
            post(json=checkpoint(report=bad_report), headers=wrong),
            401,
        ),
        ("a report not JSON's", post(content=with_big), 422),
        ("missing file", post(json=checkpoint(path="gone.pt")), 422),
        ("wrong size", post(json=checkpoint(size=1)), 422),
        ("a sharded one", post(json=checkpoint(kind="sharded")), 422),
        ("climbing out", post(json=checkpoint(path="../../c.pt")), 422),
    ]
    for what, send, status in cases:
        fast, routed = both(api, send)
        assert fast.status_code == status, (what, fast.text)
        same(fast, routed)
    assert api.get(url).json()["checkpoints"] == []  # nothing refused was registered
    # NaN, which only the route's parser reads: the route answers it, through the lean path
    nan = json.dumps(checkpoint(metrics={"val_loss": float("nan")}))
    typed = AUTH | {"Content-Type": "application/json"}
    fast, routed = both(api, lambda a: a.post(url, content=nan, headers=typed))
    assert same(fast, routed)["metrics"] == {"val_loss": None}
    # the ids the lean path leaves to the route: as the route answers them
    for other in ("99999999999999999999", f"+{job_id}", f"0{job_id}"):
        same(*both(api, post(f"/api/v1/jobs/{other}/checkpoints", json=checkpoint())))


def test_cross_site_requests_and_oversized_bodies_are_refused(
    job: tuple[TestClient, Runtime, int],
) -> None:
    api, _, job_id = job
    url = f"/api/v1/jobs/{job_id}/checkpoints"
    cross_origin(page_request(api, "POST", url, json=checkpoint(), headers=CROSS_SITE | AUTH))
    rebound = api.post(url, json=checkpoint(), headers=AUTH | {"Host": "evil.example"})
    assert rebound.status_code == 400 and error_of(rebound)["code"] == "unknown_host"
    huge = checkpoint(report={"batch_id": "b", "attempt": 1, "pad": "x" * DEFAULT_LIMIT})
    declared = api.post(url, json=huge, headers=AUTH)
    assert declared.status_code == 413 and error_of(declared)["code"] == "too_large"
    assert "1 MiB" in error_of(declared)["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it is read
        for _ in range(2):
            yield b" " * DEFAULT_LIMIT

    streamed = api.post(url, content=chunks(), headers=AUTH)
    assert streamed.status_code == 413, streamed.text
    assert "stopped after reading" in error_of(streamed)["message"]
    assert api.get(url).json()["checkpoints"] == []
    assert api.post(url, json=checkpoint(), headers=AUTH).status_code == 201


def test_a_refused_checkpoint_keeps_its_points_and_a_failed_record_takes_them_along(
    job: tuple[TestClient, Runtime, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storage refusing the checkpoint (it is not there): its points are committed all the
    same, as when they were a transaction of their own. The record's insert failing: nothing
    of the request is committed, the points with it (the SDK retries both, same batch id)."""
    api, rt, job_id = job
    url = f"/api/v1/jobs/{job_id}/checkpoints"
    report = {"batch_id": "b1", "attempt": 1, "columns": columns(0, 1)}
    missing = api.post(url, json=checkpoint(path="gone.pt", report=report), headers=AUTH)
    assert missing.status_code == 422 and "does not exist" in error_of(missing)["message"]
    series = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"name": "loss"}).json()["series"]
    assert sorted(p[0] for p in series[0]["points"]) == [0, 1]

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(rt.store.checkpoints, "add", broken)
    report = {"batch_id": "b2", "attempt": 1, "columns": columns(2, 3)}
    failed = api.post(url, json=checkpoint(report=report), headers=AUTH)
    assert failed.status_code == 500 and error_of(failed)["code"] == "internal"
    series = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"name": "loss"}).json()["series"]
    assert sorted(p[0] for p in series[0]["points"]) == [0, 1]  # steps 2, 3: not committed
    monkeypatch.undo()
    retried = api.post(url, json=checkpoint(report=report), headers=AUTH)
    assert retried.status_code == 201 and retried.json()["report"]["accepted"] == 2
    series = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"name": "loss"}).json()["series"]
    assert sorted(p[0] for p in series[0]["points"]) == [0, 1, 2, 3]


def test_the_lean_answer_is_the_route_model_s(job: tuple[TestClient, Runtime, int]) -> None:
    """The lean path writes the answer without the model: its fields are the model's, in order."""
    api, _, job_id = job
    report = {"batch_id": "b1", "attempt": 1, "columns": columns(0)}
    resp = api.post(
        f"/api/v1/jobs/{job_id}/checkpoints", json=checkpoint(report=report), headers=AUTH
    )
    assert resp.status_code == 201
    assert list(resp.json()) == list(CheckpointRegisteredOut.model_fields)
    assert CheckpointRegisteredOut.model_validate_json(resp.content).model_dump() == resp.json()


@pytest.mark.parametrize("raw", [None, "2h", 90, "absent"])
def test_a_job_s_max_runtime_without_parsing_its_spec(raw: Any) -> None:
    spec: dict[str, Any] = {"entrypoint": "python train.py"}
    if raw != "absent":
        spec["max_runtime"] = raw
    job = Job(1, "j", "o", JobState.RUNNING, "normal", spec, "0" * 64, 0.0, 0.0)
    parsed = JobSpec.model_validate(spec).max_runtime
    assert (job.max_runtime or None) == (parsed or None)
    assert ("spec" in job.__dict__) == bool(raw not in (None, "absent"))
