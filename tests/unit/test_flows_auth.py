"""Who may wait on, read through and act on what, with auth on (the app in process, a team of
an admin, two members and a viewer): a member cannot make a job wait on another member's job
to learn its state, nor read another member's model through ``inputs: {k: job:N}``; flows are
their owner's to read, cancel and resume; a viewer submits none; a job's credential reads only
the inputs its own job resolved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.team import SPEC, Team, make_team, refused


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    yield from make_team(tmp_path)


def _flow(team: Team, user: str, name: str = "f") -> object:
    return team.post(
        user,
        "/flows",
        data={
            "flow": json.dumps(
                {"name": name, "steps": [{"name": "a"}, {"name": "b", "after": ["a"]}]}
            ),
            "spec": [SPEC.format(name="a"), SPEC.format(name="b")],
            "owner": "someone-else",
        },
        files=[("workdir", ("w.tar.gz", team.archive, "application/gzip"))],
    )


def test_a_member_cannot_wait_on_or_read_through_anothers_job(team: Team) -> None:
    alices = team.submit("alice", "secret-run").json()["id"]
    said = refused(team.submit("bob", "spy", extra=f"after: [{alices}]\n"))
    assert f"job {alices} belongs to another user" in said
    said = refused(team.submit("bob", "spy", extra=f"inputs: {{x: job:{alices}}}\n"))
    assert f"inputs.x: job {alices} belongs to another user" in said
    # nothing was made, so nothing shows alice's job's state to bob
    assert [j["name"] for j in team.get("bob", "/jobs?all=true").json()["jobs"]] == []
    # alice may, and so may the admin
    own = team.submit("alice", "next", extra=f"after: [{alices}]\n")
    assert own.status_code == 201, own.text
    assert team.submit("root", "ops", extra=f"after: [{alices}]\n").status_code == 201


def test_flows_are_their_owners(team: Team) -> None:
    made = _flow(team, "alice")
    assert made.status_code == 201, made.text  # type: ignore[attr-defined]
    flow = made.json()  # type: ignore[attr-defined]
    assert flow["owner"] == "alice"  # the token's user, whatever the form says
    fid = flow["id"]
    assert "belongs to another user" in refused(team.get("bob", f"/flows/{fid}"))
    assert team.get("bob", "/flows").json() == {"flows": [], "total": 0}
    assert refused(team.post("bob", f"/flows/{fid}/cancel"))
    assert refused(team.post("bob", f"/flows/{fid}/resume"))
    assert "viewers can read" in refused(_flow(team, "vera"))  # type: ignore[arg-type]
    assert team.get("root", f"/flows/{fid}").status_code == 200
    assert team.get("alice", "/flows").json()["total"] == 1
    canceled = team.post("alice", f"/flows/{fid}/cancel")
    assert canceled.status_code == 200, canceled.text
    assert {s["state"] for s in canceled.json()["steps"]} == {"CANCELED"}


def test_a_jobs_credential_reads_only_its_own_inputs(team: Team) -> None:
    job = team.submit("alice", "a").json()["id"]
    # a person's token is not a job's credential; an unknown credential is refused
    assert team.get("alice", f"/jobs/{job}/inputs/candidate/manifest").status_code == 401
    resp = team.api.get(
        f"/api/v1/jobs/{job}/inputs/candidate/manifest",
        headers={"Authorization": f"Bearer thj_{job}_{'0' * 40}"},
    )
    assert resp.status_code == 401
