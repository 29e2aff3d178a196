"""Users, tokens, roles and job credentials through the real app (in process), auth on.

alice and bob are members, vera a viewer, root the admin. Jobs stay queued: every user's CPU
quota is 0, so nothing starts and each test reads the store as the requests left it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.api import page_request
from tests.support.team import SPEC, Team, make_team, refused
from trainhouse.core.tokens import hash_token, job_token
from trainhouse.server import Settings


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    yield from make_team(tmp_path)


def job_paths(job_id: int) -> list[str]:
    return [
        f"/jobs/{job_id}",
        f"/jobs/{job_id}/metrics",
        f"/jobs/{job_id}/metrics/names",
        f"/jobs/{job_id}/logs",
        f"/jobs/{job_id}/logs/ranks",
        f"/jobs/{job_id}/checkpoints",
        f"/jobs/{job_id}/system",
    ]


def test_no_token_or_a_bad_one_is_401_and_health_stays_open(team: Team) -> None:
    assert team.api.get("/api/v1/health").json()["auth"] is True
    assert team.api.get("/api/v1/health").json()["home"] is None  # no paths to strangers
    for path in ("/jobs", "/queue", "/nodes", "/whoami", "/quotas"):
        assert "needs a token" in refused(team.api.get(f"/api/v1{path}"), 401)
    bad = {"Authorization": "Bearer thu_not-a-real-token"}
    assert "unknown token" in refused(team.api.get("/api/v1/jobs", headers=bad), 401)
    assert team.api.get("/metrics").status_code == 401  # Prometheus needs a token too


def test_owner_comes_from_the_token(team: Team) -> None:
    job = team.submit("alice").json()
    assert job["owner"] == "alice"  # the form's "someone-else" is ignored


def test_members_cannot_read_or_touch_each_others_jobs(team: Team) -> None:
    mine = team.submit("alice", "alices").json()["id"]
    for path in job_paths(mine):
        assert team.get("alice", path).status_code == 200, path
        assert "belongs to another user" in refused(team.get("bob", path)), path
        assert "belongs to another user" in refused(team.get("vera", path)), path
        assert team.get("root", path).status_code == 200, path
    for user in ("bob", "vera"):  # (a permitted stream would follow the queued job forever)
        refused(team.get(user, f"/jobs/{mine}/logs/stream"))
        refused(team.post(user, f"/jobs/{mine}/cancel"))
        refused(team.post(user, f"/jobs/{mine}/priority", json={"priority": "low"}))
        listed = team.get(user, "/jobs", params={"all": "true"}).json()
        assert listed["jobs"] == [] and listed["total"] == 0
        assert team.get(user, "/queue").json()["jobs"] == []
        refused(team.get(user, "/jobs", params={"owner": "alice"}))
    assert [j["id"] for j in team.get("alice", "/jobs").json()["jobs"]] == [mine]
    assert [j["id"] for j in team.get("root", "/jobs").json()["jobs"]] == [mine]
    assert team.get("alice", "/queue").json()["jobs"][0]["id"] == mine
    assert team.rt.store.jobs.get(mine).state == "QUEUED"  # nothing the others did stuck
    assert team.post("alice", f"/jobs/{mine}/cancel").json()["state"] == "CANCELED"


def test_checkpoint_downloads_are_the_owners(team: Team) -> None:
    mine = team.submit("alice").json()["id"]
    ckpt_dir = Path(team.rt.checkpoints.location(mine))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (ckpt_dir / "step-1.pt").write_bytes(b"weights")
    ckpt = team.rt.store.checkpoints.add(
        mine, attempt=1, step=1, path="step-1.pt", size=7, sha256="0" * 64
    )
    for path in (
        f"/jobs/{mine}/checkpoints/{ckpt.id}/files",
        f"/jobs/{mine}/checkpoints/{ckpt.id}/content",
    ):
        assert team.get("alice", path).status_code == 200, path
        refused(team.get("bob", path))
        refused(team.get("vera", path))
    assert team.get("alice", f"/jobs/{mine}/checkpoints/{ckpt.id}/content").content == b"weights"


def test_viewers_never_write(team: Team) -> None:
    assert "viewers can read" in refused(team.submit("vera"))
    dry = team.post("vera", "/jobs/dry-run", data={"spec": SPEC.format(name="x")})
    refused(dry)
    refused(team.api.put("/api/v1/quotas/vera", json={"max_cpus": 1}, headers=team.h("vera")))


def test_priority_above_normal_and_quotas_are_for_admins(team: Team) -> None:
    assert "only admins" in refused(team.submit("alice", extra="priority: high\n"))
    job = team.submit("alice").json()["id"]
    refused(team.post("alice", f"/jobs/{job}/priority", json={"priority": "urgent"}))
    assert team.post("alice", f"/jobs/{job}/priority", json={"priority": "low"}).status_code == 200
    resp = team.post("root", f"/jobs/{job}/priority", json={"priority": "urgent"})
    assert resp.json()["priority"] == "urgent"
    refused(team.api.put("/api/v1/quotas/alice", json={"max_cpus": 9}, headers=team.h("alice")))
    refused(team.api.delete("/api/v1/quotas/alice", headers=team.h("bob")))
    assert team.submit("root", extra="priority: high\n").status_code == 201


def test_visibility_list_and_all(tmp_path: Path) -> None:
    for visibility in ("list", "all"):
        for team in make_team(tmp_path / visibility, job_visibility=visibility):
            mine = team.submit("alice").json()["id"]
            listed = team.get("bob", "/jobs").json()["jobs"]
            assert [j["id"] for j in listed] == [mine]
            # a shared list shows whose job it is, not its hparams, env or metrics
            assert ("hparams" in listed[0]["spec"]) == (visibility == "all")
            assert [j["id"] for j in team.get("vera", "/queue").json()["jobs"]] == [mine]
            detail = team.get("bob", f"/jobs/{mine}")
            assert detail.status_code == (200 if visibility == "all" else 403)
            refused(team.post("bob", f"/jobs/{mine}/cancel"))  # never a write
            refused(team.post("vera", f"/jobs/{mine}/cancel"))


def test_a_job_credential_reaches_its_own_job_only(team: Team) -> None:
    mine = team.submit("alice", "a").json()["id"]
    other = team.submit("alice", "b").json()["id"]
    secret = job_token(mine)
    team.rt.store.jobs.update(mine, token_hash=hash_token(secret))
    job = {"Authorization": f"Bearer {secret}"}
    api = team.api
    assert api.get("/api/v1/whoami", headers=job).json()["role"] == "job"
    assert api.get(f"/api/v1/jobs/{mine}/checkpoints", headers=job).status_code == 200
    report = {"batch_id": "b1", "attempt": 1, "points": []}
    assert api.post(f"/api/v1/jobs/{mine}/report", json=report, headers=job).status_code == 200
    for path in [*job_paths(other), f"/jobs/{other}/logs/stream"]:
        assert "its own job" in refused(api.get(f"/api/v1{path}", headers=job)), path
    refused(api.post(f"/api/v1/jobs/{other}/report", json=report, headers=job), 401)
    for method, path in (
        ("GET", "/jobs"),
        ("GET", "/queue"),
        ("POST", f"/jobs/{mine}/cancel"),
        ("POST", f"/jobs/{other}/cancel"),
        ("GET", "/tokens"),
        ("POST", "/tokens"),
        ("GET", "/users"),
        ("GET", "/audit"),
    ):
        resp = api.request(method, f"/api/v1{path}", headers=job, json={})
        assert resp.status_code == 403, (method, path, resp.text)
    assert team.rt.store.jobs.get(mine).state == "QUEUED"
    # the credential dies with the attempt: once the job leaves RUNNING it is cleared
    team.rt.store.jobs.update(mine, token_hash=None)
    refused(api.get(f"/api/v1/jobs/{mine}/checkpoints", headers=job), 401)


def test_the_job_credential_is_cleared_when_the_attempt_ends(team: Team) -> None:
    store = team.rt.store
    job = team.submit("alice").json()["id"]
    _started, _attempt = store.jobs.start_attempt(job, placement=(), token_hash=hash_token("x"))
    assert store.jobs.get(job).token_hash == hash_token("x")
    store.jobs.transition(job, store.jobs.get(job).state.__class__("FAILED"), reason="test")
    assert store.jobs.get(job).token_hash is None


def test_tokens_expire_revoke_and_disable(team: Team) -> None:
    made = team.post("alice", "/tokens", json={"name": "laptop", "expires_in": 1}).json()
    assert made["secret"].startswith("thu_") and made["token"]["user"] == "alice"
    fresh = {"Authorization": f"Bearer {made['secret']}"}
    assert team.api.get("/api/v1/whoami", headers=fresh).json()["name"] == "alice"
    time.sleep(1.2)
    assert "expired" in refused(team.api.get("/api/v1/whoami", headers=fresh), 401)
    # a member cannot make tokens for others, nor revoke theirs
    refused(team.post("alice", "/tokens", json={"user": "bob"}))
    bobs = team.get("bob", "/tokens").json()["tokens"][0]["id"]
    refused(team.api.delete(f"/api/v1/tokens/{bobs}", headers=team.h("alice")))
    # revoking works at once, even though the token was just used (and cached)
    assert team.get("bob", "/whoami").status_code == 200
    assert team.api.delete(f"/api/v1/tokens/{bobs}", headers=team.h("bob")).status_code == 200
    assert "revoked" in refused(team.get("bob", "/whoami"), 401)
    # a disabled user's tokens stop working; the last admin cannot demote themself
    assert team.get("alice", "/whoami").status_code == 200
    resp = team.api.patch("/api/v1/users/alice", json={"disabled": True}, headers=team.h("root"))
    assert resp.status_code == 200
    assert "disabled" in refused(team.get("alice", "/whoami"), 401)
    resp = team.api.patch("/api/v1/users/root", json={"role": "member"}, headers=team.h("root"))
    assert "last active admin" in refused(resp, 409 if resp.status_code == 409 else 400)
    # the store keeps hashes only
    with team.rt.store.engine.connect() as conn:
        stored = [r[0] for r in conn.exec_driver_sql("SELECT hash FROM api_tokens")]
    assert team.tokens["alice"] not in stored and hash_token(team.tokens["alice"]) in stored


def test_users_are_managed_by_admins(team: Team) -> None:
    refused(team.post("alice", "/users", json={"name": "eve", "role": "admin"}))
    assert team.post("root", "/users", json={"name": "eve"}).json()["role"] == "member"
    assert "already exists" in refused(team.post("root", "/users", json={"name": "eve"}), 409)
    refused(team.post("root", "/users", json={"name": "Bad Name"}), 422)
    names = [u["name"] for u in team.get("root", "/users").json()["users"]]
    assert names == ["alice", "bob", "eve", "root", "vera"]


def test_failed_token_uses_are_rate_limited_and_audited(team: Team) -> None:
    bad = {"Authorization": "Bearer thu_guess"}
    codes = [team.api.get("/api/v1/jobs", headers=bad).status_code for _ in range(15)]
    assert codes[:10] == [401] * 10 and set(codes[10:]) == {429}
    # a valid token from the same address still works (people behind one NAT)
    assert team.get("alice", "/whoami").status_code == 200
    audit = team.get("root", "/audit", params={"action": "auth.failure"}).json()
    assert audit["total"] == 10  # the 429s are not written one by one
    assert audit["entries"][0]["ok"] is False and audit["entries"][0]["client"]


def test_admin_actions_and_cancellations_are_audited(team: Team) -> None:
    job = team.submit("alice").json()["id"]
    team.post("alice", f"/jobs/{job}/cancel")
    team.post("root", "/users", json={"name": "carol", "role": "viewer"})
    team.post("root", "/tokens", json={"user": "carol", "name": "ci"})
    entries = team.get("root", "/audit").json()["entries"]
    actions = [(e["actor"], e["action"], e["target"]) for e in entries]
    assert ("alice", "job.cancel", f"job:{job}") in actions
    assert ("root", "user.add", "carol") in actions
    assert ("root", "token.create", "carol") in actions
    assert ("root", "quota.set", "alice") in actions
    refused(team.get("alice", "/audit"))


def test_dashboard_session_cookie_needs_the_csrf_header_to_write(team: Team) -> None:
    api = team.api
    resp = api.post("/api/v1/session", json={"token": team.tokens["alice"]})
    assert resp.status_code == 200 and resp.json()["name"] == "alice"
    assert "httponly" in resp.headers["set-cookie"].lower()
    job = team.submit("alice").json()["id"]
    assert api.get(f"/api/v1/jobs/{job}").status_code == 200  # the cookie signs it in
    # a page of this server without the header (another site's is stopped before: test_origin)
    same_origin = {"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1"}
    message = refused(page_request(api, "POST", f"/api/v1/jobs/{job}/cancel", headers=same_origin))
    assert "signed in by cookie must carry the X-Trainhouse-Request: 1 header" in message
    ok = api.post(f"/api/v1/jobs/{job}/cancel", headers={"X-Trainhouse-Request": "1"})
    assert ok.json()["state"] == "CANCELED"
    api.delete("/api/v1/session")
    refused(api.get(f"/api/v1/jobs/{job}"), 401)


def test_auth_is_off_on_loopback_by_default_and_on_elsewhere() -> None:
    assert not Settings(home=Path("/x")).auth_enabled
    assert Settings(home=Path("/x"), host="0.0.0.0").auth_enabled
    assert Settings(home=Path("/x"), host="127.0.0.1", auth=True).auth_enabled
    assert not Settings(home=Path("/x"), host="0.0.0.0", insecure_no_auth=True).auth_enabled
    with pytest.raises(ValueError, match="auth off"):
        Settings(home=Path("/x"), host="10.0.0.1", auth=False).check_auth()
