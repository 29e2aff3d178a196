"""What fuzzing the API found (tests/integration/test_fuzz.py), pinned: each was a 500.

Through the real app in process, auth on, on SQLite and on PostgreSQL (where most of them
showed: PostgreSQL refuses an id past a BIGINT, a NUL character, a string longer than its
column, an INTEGER past 2**31 - 1; SQLite a Python int past 2**63 - 1 and an UPDATE that
sets nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import DataError

from tests.support.api import fake_executor, in_process
from tests.support.team import Team, make_team, refused
from trainhouse.core.reports import parse_report
from trainhouse.core.tokens import hash_token, job_token
from trainhouse.errors import InvalidMetrics, StoreError
from trainhouse.server import Settings, create_app
from trainhouse.store import Store

INT64 = 2**63 - 1
PAST_BIGINT = (INT64 + 1, 2**64, -(2**63) - 1)
NUL = "a\x00b"
NUL_IN_PATH = "a%00b"


@pytest.fixture(params=["sqlite", "postgresql"])
def team(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Team]:
    if request.param == "sqlite":
        yield from make_team(tmp_path)
        return
    url: str = request.getfixturevalue("pg_url")
    Store(url).close()  # migrated, as `trainhouse db upgrade` leaves it
    yield from make_team(tmp_path, db_url=url)


def job_of(team: Team) -> int:
    resp = team.submit("root")
    assert resp.status_code == 201, resp.text
    return int(resp.json()["id"])


def test_ids_past_a_bigint_are_refused_not_looked_up(team: Team) -> None:
    job = job_of(team)
    for big in PAST_BIGINT:
        for method, path in [
            ("GET", f"/jobs/{big}"),
            ("GET", f"/jobs/{big}/metrics"),
            ("GET", f"/jobs/{big}/logs"),
            ("GET", f"/jobs/{big}/checkpoints"),
            ("GET", f"/jobs/{big}/system"),
            ("POST", f"/jobs/{big}/cancel"),
            ("POST", f"/jobs/{big}/report"),
            ("GET", f"/jobs/{job}/checkpoints/{big}/files"),
            ("GET", f"/jobs/{job}/checkpoints/{big}/content"),
            ("DELETE", f"/tokens/{big}"),
        ]:
            resp = team.api.request(method, f"/api/v1{path}", headers=team.h("root"))
            message = refused(resp, 422)
            assert "less than or equal to" in message or "greater than or equal to" in message
    # the largest id a row may have is still looked up: there is no such row
    assert team.get("root", f"/jobs/{INT64}").status_code == 404
    assert team.get("root", f"/jobs/{job}/checkpoints/{INT64}/files").status_code == 404
    assert team.api.delete(f"/api/v1/tokens/{INT64}", headers=team.h("root")).status_code == 404


def test_a_job_list_offset_past_a_bigint_is_refused(team: Team) -> None:
    message = refused(team.get("root", "/jobs", params={"offset": INT64 + 1}), 422)
    assert message.startswith("offset:")
    resp = team.get("root", "/jobs", params={"offset": INT64, "all": "true"})
    assert resp.status_code == 200 and resp.json()["jobs"] == []


def test_quota_caps_and_owners_must_fit_their_columns(team: Team) -> None:
    def put(owner: str, body: dict[str, int]) -> Any:
        return team.api.put(f"/api/v1/quotas/{owner}", json=body, headers=team.h("root"))

    assert refused(put("carol", {"max_gpus": 2**31}), 422).startswith("max_gpus:")
    assert refused(put("carol", {"max_cpus": 2**63}), 422).startswith("max_cpus:")
    resp = put("carol", {"max_gpus": 2**31 - 1})
    assert resp.status_code == 200 and resp.json()["max_gpus"] == 2**31 - 1
    assert refused(put("c" * 129, {"max_gpus": 1}), 422).startswith("owner:")
    assert put("c" * 128, {"max_gpus": 1}).status_code == 200
    refused(team.api.delete(f"/api/v1/quotas/{'c' * 129}", headers=team.h("root")), 422)


def test_patching_a_user_with_nothing_to_change_changes_nothing(team: Team) -> None:
    resp = team.api.patch("/api/v1/users/alice", json={}, headers=team.h("root"))
    assert resp.status_code == 200, resp.text
    assert resp.json()["role"] == "member" and resp.json()["disabled_at"] is None
    assert team.get("alice", "/whoami").json()["name"] == "alice"


def test_nul_characters_are_refused_before_the_database(team: Team) -> None:
    job = job_of(team)
    for path, params in [
        ("/jobs", {"owner": NUL}),
        ("/jobs", {"name": NUL}),
        (f"/jobs/{job}/metrics", {"name": NUL}),
        ("/tokens", {"user": NUL}),
        ("/audit", {"actor": NUL}),
        ("/audit", {"action": ["token.create", NUL]}),
        ("/nodes/x/metrics", {"name": NUL}),
    ]:
        message = refused(team.get("root", path, params=params), 422)
        assert "must not contain a NUL character" in message, (path, message)
    h = team.h("root")
    for resp in [
        team.api.patch(f"/api/v1/users/{NUL_IN_PATH}", json={"role": "member"}, headers=h),
        team.api.put(f"/api/v1/quotas/{NUL_IN_PATH}", json={"share": 2}, headers=h),
        team.api.delete(f"/api/v1/quotas/{NUL_IN_PATH}", headers=h),
        team.api.post("/api/v1/tokens", json={"name": "x", "user": NUL}, headers=h),
    ]:
        assert "must not contain a NUL character" in refused(resp, 422)


def test_a_report_batch_id_holds_no_nul() -> None:
    with pytest.raises(InvalidMetrics, match="must not contain a NUL character"):
        parse_report({"batch_id": NUL, "attempt": 1, "points": []})


@pytest.fixture
def bare_app(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path / "home", port=1, cpus=1, gpus="0", tick=0.1)
    app = create_app(settings, executor=fake_executor(settings))

    @app.get("/boom/sql")
    def _sql() -> None:
        raise DataError(
            "INSERT INTO user_limits (owner) VALUES (%(owner)s)",
            {"owner": "x" * 300},
            Exception("value too long for type character varying(128)"),
        )

    @app.get("/boom/bug")
    def _bug() -> None:
        raise RuntimeError(f'SELECT * FROM jobs; File "{tmp_path}/x.py", line 1; sqlalchemy')

    with in_process(app, raise_server_exceptions=False) as client:
        yield client


def test_error_bodies_never_carry_the_exception(bare_app: TestClient, tmp_path: Path) -> None:
    # a value the database refuses is the caller's: 422, and the SQL stays in the server's log
    resp = bare_app.get("/boom/sql")
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "invalid_value"
    # anything else is a 500 that says only that
    resp = bare_app.get("/boom/bug")
    assert resp.status_code == 500
    assert resp.json() == {
        "error": {"code": "internal", "message": "internal server error; see the server log"}
    }
    for resp in (bare_app.get("/boom/sql"), bare_app.get("/boom/bug")):
        for word in ("INSERT", "SELECT", "user_limits", "varying", "sqlalchemy", str(tmp_path)):
            assert word not in resp.text


def test_a_database_url_password_stays_out_of_errors() -> None:
    for url in ("postgresql+psycopg3://bob:s3cret@db.example/th", "nonsense://bob:s3cret@x/y"):
        with pytest.raises(StoreError) as err:
            Store(url)
        assert "s3cret" not in str(err.value) and "bob:***@" in str(err.value)


def test_what_a_job_reports_must_fit_the_columns(team: Team) -> None:
    job = job_of(team)
    secret = job_token(job)
    team.rt.store.jobs.update(job, token_hash=hash_token(secret))
    h = {"Authorization": f"Bearer {secret}"}
    point = [[1, "loss", 0.5, None, 1.0]]
    report = {"batch_id": "b1", "attempt": 2**31, "points": point}
    resp = team.api.post(f"/api/v1/jobs/{job}/report", json=report, headers=h)
    assert refused(resp, 422).startswith("attempt: must be an integer from 1 to 2147483647")
    report = {"batch_id": "b2", "attempt": 2**31 - 1, "points": point}
    assert team.api.post(f"/api/v1/jobs/{job}/report", json=report, headers=h).status_code == 200
    good: dict[str, Any] = {"attempt": 1, "step": 1, "path": "c.pt", "size": 1, "sha256": "0" * 64}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"attempt": 2**31}, "attempt"),
        ({"step": INT64 + 1}, "step"),
        ({"size": INT64 + 1}, "size"),
        ({"path": NUL}, "path"),
    ]
    for bad, field in cases:
        resp = team.api.post(f"/api/v1/jobs/{job}/checkpoints", json=good | bad, headers=h)
        assert refused(resp, 422).startswith(f"{field}:")
    resp = team.api.post(
        f"/api/v1/jobs/{job}/checkpoints/1/corrupt", json={"reason": NUL}, headers=h
    )
    assert "must not contain a NUL character" in refused(resp, 422)
