"""A team server, end to end: a real server with auth on, users made with the CLI, tokens
stored by ``trainhouse login``, members kept apart, and a running job whose credential reaches
its own job only."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import REPO, Server, assert_clean_stop, start_server
from trainhouse.client import Client

PROBE = """\
import os
import trainhouse
from trainhouse.client import Client
from trainhouse.errors import ClientError

other = int(os.environ["OTHER_JOB"])
with Client() as c:                       # TRAINHOUSE_TOKEN is this job's credential
    me = c.whoami()
    print("WHOAMI", me["role"], me["job_id"], flush=True)
    attempts = {
        "show": lambda: c.job(other),
        "metrics": lambda: c.metrics(other),
        "checkpoints": lambda: c.checkpoints(other),
        "logs": lambda: c.logs(other),
        "cancel": lambda: c.cancel(other),
        "list": lambda: c.jobs(),
        "cancel-self": lambda: c.cancel(int(os.environ["TRAINHOUSE_JOB_ID"])),
        "token": lambda: c.create_token("stolen"),
    }
    for what, call in attempts.items():
        try:
            call()
            print("REACHED", what, flush=True)
        except ClientError as exc:
            print("REFUSED", what, exc.status, flush=True)
with trainhouse.init() as run:
    run.log({"probe": 1.0}, step=0)
"""


def th(
    server: Server,
    *args: str,
    token: str | None = None,
    config: Path | None = None,
    stdin: str = "",
) -> subprocess.CompletedProcess[str]:
    env = {"TRAINHOUSE_TOKEN": token} if token else {}
    if config:
        env["TRAINHOUSE_CONFIG_DIR"] = str(config)
    return server.cli(*args, env=env, stdin=stdin)


def wait(srv: Server, job_id: int, states: set[str], token: str) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    with Client(srv.url, token=token) as c:
        while True:
            job = c.job(job_id)
            if job["state"] in states:
                return job
            assert time.monotonic() < deadline, f"job {job_id} still {job['state']}"
            time.sleep(0.3)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def js(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result))


def spec(tmp_path: Path, name: str, script: str, env: dict[str, str] | None = None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.py").write_text(script)
    lines = [f"name: {name}", "entrypoint: python train.py", "resources: {procs_per_node: 1}"]
    if env:
        lines.append("env: " + json.dumps(env))
    (folder / "trainhouse.yaml").write_text("\n".join(lines) + "\n")
    return folder / "trainhouse.yaml"


@pytest.fixture
def team_server(tmp_path: Path) -> Any:
    srv = start_server(tmp_path / "home", "--cpus", "4", "--auth")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def test_a_team_server_keeps_members_apart(team_server: Server, tmp_path: Path) -> None:
    srv = team_server
    assert srv.client.health()["auth"] is True
    # the first admin is made on the server's machine, straight in its database
    root = srv.admin_token()
    again = th(srv, "admin", "init", "--home", str(srv.home), "--db", srv.db_url)
    assert again.returncode != 0 and "already has an admin" in again.stderr
    tokens = {}
    for name, role in (("alice", "member"), ("bob", "member"), ("vera", "viewer")):
        out = js(th(srv, "admin", "user", "add", name, "--role", role, "--json", token=root))
        tokens[name] = out["token"]["secret"]
    # login checks the token and stores it for this user only
    config = tmp_path / "alice-config"
    out = ok(th(srv, "login", stdin=tokens["alice"] + "\n", config=config))
    assert "alice (member)" in out
    stored = config / "credentials.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.stat().st_mode) == 0o700
    assert json.loads(stored.read_text()) == {srv.url: tokens["alice"]}
    assert "alice (member)" in ok(th(srv, "whoami", config=config))
    bad = th(srv, "login", "--token", "thu_wrong", config=tmp_path / "x")
    assert bad.returncode == 2 and "refused" in bad.stderr

    # bob's job waits for alice's (2 CPUs each on a 4-CPU server... both run; fine)
    bobs = js(
        th(
            srv,
            "submit",
            str(spec(tmp_path, "bobs", "print('secret of bob')\n")),
            "--json",
            token=tokens["bob"],
        )
    )
    assert bobs["owner"] == "bob"
    wait(srv, bobs["id"], {"COMPLETED"}, root)
    probe = spec(tmp_path, "probe", PROBE, env={"OTHER_JOB": str(bobs["id"])})
    mine = js(th(srv, "submit", str(probe), "--json", config=config))
    assert mine["owner"] == "alice"
    done = wait(srv, mine["id"], {"COMPLETED", "FAILED"}, root)
    log = ok(th(srv, "logs", str(mine["id"]), config=config))
    assert done["state"] == "COMPLETED", log
    assert f"WHOAMI job {mine['id']}" in log
    assert "REACHED" not in log, log
    for what in (
        "show",
        "metrics",
        "checkpoints",
        "logs",
        "cancel",
        "list",
        "cancel-self",
        "token",
    ):
        assert f"REFUSED {what} 403" in log, (what, log)

    # members and viewers cannot see or touch each other's jobs from the CLI either
    for user in ("bob", "vera"):
        for args in (
            ("show", str(mine["id"])),
            ("logs", str(mine["id"])),
            ("metrics", str(mine["id"])),
            ("checkpoints", str(mine["id"])),
            ("cancel", str(mine["id"])),
        ):
            result = th(srv, *args, token=tokens[user])
            assert result.returncode == 2, (user, args)
            assert "another user" in result.stderr or "viewers can read" in result.stderr
        listed = js(th(srv, "ps", "--all", "--json", token=tokens[user]))
        assert mine["id"] not in [j["id"] for j in listed]
    assert "viewers can read" in th(srv, "submit", str(probe), token=tokens["vera"]).stderr
    assert "secret of bob" not in log

    # tokens: revoke ends one at once; the audit log has it all
    listed = js(th(srv, "admin", "token", "list", "--json", token=tokens["bob"]))
    assert [t["user"] for t in listed] == ["bob"] and "secret" not in json.dumps(listed)
    ok(th(srv, "admin", "token", "revoke", str(listed[0]["id"]), token=tokens["bob"]))
    assert th(srv, "ps", token=tokens["bob"]).returncode == 2
    audit = js(th(srv, "admin", "audit", "--json", "--limit", "200", token=root))
    actions = {(e["actor"], e["action"]) for e in audit["entries"]}
    assert {("admin", "user.add"), ("bob", "token.revoke"), ("-", "auth.failure")} <= actions
    assert any(a == "admin.init" for _, a in actions)
    refused = th(srv, "admin", "audit", token=tokens["alice"])
    assert refused.returncode == 2 and "only admins" in refused.stderr


def test_a_server_on_another_address_needs_auth_unless_told(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainhouse",
            "server",
            "--host",
            "0.0.0.0",
            "--auth",
            "--insecure-no-auth",
            "--home",
            str(tmp_path / "h"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 2 and "contradict" in result.stderr
