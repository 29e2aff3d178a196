"""Every token use is checked the same way: malformed tokens are refused (never a 500), wrong job
credentials on the report routes are rate-limited and audited, and an open log stream keeps
checking its caller's token; open streams are capped per user and in all."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.team import Team, make_team, refused
from trainhouse.client.api import _sse
from trainhouse.core.tokens import hash_token, job_of_token, job_token
from trainhouse.server.routes import logs


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    yield from make_team(tmp_path)


def test_a_job_credential_with_a_non_ascii_job_id_is_refused(team: Team) -> None:
    assert job_of_token("thj_²_x") is None and job_of_token("thj_\u0661\u0662_x") is None
    assert job_of_token("thj_12_x") == 12
    for token in ("thj_²_x", "thj_" + "9" * 5000 + "_x"):  # (a header is Latin-1)
        auth = {"Authorization": f"Bearer {token}".encode("latin-1")}
        assert "was refused" in refused(team.api.get("/api/v1/jobs", headers=auth), 401)


def test_wrong_job_credentials_on_the_report_routes_are_rate_limited_and_audited(
    team: Team,
) -> None:
    job = team.submit("alice").json()["id"]
    secret = job_token(job)
    team.rt.store.jobs.update(job, token_hash=hash_token(secret))
    wrong = {"Authorization": f"Bearer {job_token(job)}"}
    report = {"batch_id": "b1", "attempt": 1, "points": []}
    checkpoint = {"attempt": 1, "step": 1, "path": "a.pt", "size": 1, "sha256": "0" * 64}
    codes = []
    for i in range(12):
        path, body = ("report", report) if i % 2 else ("checkpoints", checkpoint)
        resp = team.api.post(f"/api/v1/jobs/{job}/{path}", json=body, headers=wrong)
        codes.append(resp.status_code)
    assert codes[:10] == [401] * 10 and codes[10:] == [429, 429]
    assert "too many failed token uses" in refused(
        team.api.post(f"/api/v1/jobs/{job}/report", json=report, headers=wrong), 429
    )
    # the job's own credential still works from the same address
    right = {"Authorization": f"Bearer {secret}"}
    assert team.api.post(f"/api/v1/jobs/{job}/report", json=report, headers=right).is_success
    audit = team.get("root", "/audit", params={"action": "auth.failure"}).json()
    assert audit["total"] == 10
    entry = audit["entries"][0]
    assert entry["ok"] is False and entry["detail"]["token"] == wrong["Authorization"][7:17]
    assert f"job {job}" in entry["detail"]["reason"]


# -- log streams -----------------------------------------------------------------------------
def stream(team: Team, user: str, job: int, **params: Any) -> tuple[int, list[tuple[str, Any]]]:
    resp = team.get(user, f"/jobs/{job}/logs/stream", params=params)
    if resp.status_code != 200:
        return resp.status_code, [("error", resp.json()["error"])]
    return 200, list(_sse(iter(resp.text.splitlines())))


def test_log_stream_ranks_are_ascii_digits_of_bounded_length(team: Team) -> None:
    job = team.submit("alice").json()["id"]
    for bad in ("²", "\u0661", "9" * 5000, "-1", "0x1", ""):
        resp = team.get("alice", f"/jobs/{job}/logs/stream", params={"rank": bad})
        assert "rank" in refused(resp, 422), bad
        resp = team.get("alice", f"/jobs/{job}/logs/stream", params={"from": f"{bad}:12"})
        assert "0:1234,1:88" in refused(resp, 422), bad
    assert "rank" in refused(
        team.get("alice", f"/jobs/{job}/logs/stream", params={"rank": " 1"}), 422
    )
    resp = team.get("alice", f"/jobs/{job}/logs/stream", params={"from": "0:" + "9" * 5000})
    assert "0:1234,1:88" in refused(resp, 422)
    assert "there is no rank 1" in refused(
        team.get("alice", f"/jobs/{job}/logs/stream", params={"rank": "1"}), 404
    )


@pytest.mark.parametrize("end", ["revoke", "disable"])
def test_an_open_stream_ends_once_its_token_no_longer_works(
    team: Team, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    monkeypatch.setattr(logs, "RECHECK_SECONDS", 0.2)
    job = team.submit("alice").json()["id"]  # queued for good: the stream would never end
    token_id = team.get("alice", "/tokens").json()["tokens"][0]["id"]

    def cut_off() -> None:
        time.sleep(1.0)
        if end == "revoke":
            resp = team.api.delete(f"/api/v1/tokens/{token_id}", headers=team.h("root"))
        else:
            resp = team.api.patch(
                "/api/v1/users/alice", json={"disabled": True}, headers=team.h("root")
            )
        assert resp.is_success, resp.text

    thread = threading.Thread(target=cut_off)
    thread.start()
    began = time.monotonic()
    status, events = stream(team, "alice", job)
    thread.join()
    assert status == 200 and time.monotonic() - began < 30
    kind, data = events[-1]
    assert kind == "error" and data["status"] == 401, events
    assert "was refused" in data["message"]
    assert team.rt.streams.open() == 0


def test_open_streams_are_capped_per_user_and_in_all(team: Team) -> None:
    job = team.submit("alice").json()["id"]
    team.post("alice", f"/jobs/{job}/cancel")  # ended: its stream ends at once
    per_user = team.rt.settings.log_streams_per_user
    slots = team.rt.streams
    held = [slots.acquire("alice", per_user=per_user, total=10_000) for _ in range(per_user)]
    status, events = stream(team, "alice", job)
    assert status == 429 and events[0][1]["code"] == "rate_limited"
    assert f"alice has {per_user} log streams open" in events[0][1]["message"]
    assert stream(team, "root", job)[1][-1] == ("end", {"state": "CANCELED"})
    held.pop()()  # one closes: alice may open another
    assert stream(team, "alice", job)[0] == 200
    assert slots.open("alice") == per_user - 1
    for release in held:
        release()
    total = team.rt.settings.log_streams
    held = [slots.acquire(f"user{i}", per_user=1, total=total) for i in range(total)]
    status, events = stream(team, "root", job)
    assert status == 429 and f"{total} log streams open" in events[0][1]["message"]
    for release in held:
        release()
    assert slots.open() == 0
