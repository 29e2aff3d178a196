"""A model belongs to whoever registered its first version (tests/unit/test_model_registry_api.py
has the registry itself): on the real app in process with auth on, another member neither adds
versions to it, nor moves or removes its aliases, nor deletes its versions; an admin gives it to
another user (audited, as every alias move is); a cross-site page gives nothing away."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.api import page_request
from tests.support.records import new_job
from tests.support.team import Team, make_team, refused

CROSS_SITE = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    for team in make_team(tmp_path):
        store = team.rt.store
        for step in (1, 2):
            store.models.add_version(
                "tiny",
                owner="alice",
                job_id=new_job(store, owner="alice"),
                attempt=1,
                step=step,
                path=f"models/tiny/step-{step:09d}",
                kind="export",
                files=[{"name": "model.json", "size": 1, "sha256": "0" * 64}],
                metrics={},
                signature={"inputs": [], "outputs": []},
                record={},
            )
        yield team


def put(team: Team, user: str, path: str, **kw: Any) -> Any:
    return team.api.put(f"/api/v1{path}", headers=team.h(user), **kw)


def delete(team: Team, user: str, path: str) -> Any:
    return team.api.delete(f"/api/v1{path}", headers=team.h(user))


def test_only_its_owner_and_the_admins_change_a_model(team: Team) -> None:
    bob_job = team.submit("bob").json()["id"]
    message = refused(team.post("bob", "/models/tiny/versions", json={"job": bob_job}))
    assert "belongs to alice" in message and "'bob' may not change it" in message
    assert "belongs to alice" in refused(
        put(team, "bob", "/models/tiny/aliases/prod", json={"version": 1})
    )
    assert "belongs to alice" in refused(delete(team, "bob", "/models/tiny/versions/1"))
    refused(put(team, "vera", "/models/tiny/aliases/prod", json={"version": 1}))  # a viewer
    assert [v["version"] for v in team.get("bob", "/models/tiny").json()["versions"]] == [1, 2]

    assert put(team, "alice", "/models/tiny/aliases/prod", json={"version": 1}).status_code == 200
    assert put(team, "root", "/models/tiny/aliases/prod", json={"version": 2}).status_code == 200
    assert delete(team, "alice", "/models/tiny/aliases/prod").status_code == 204
    assert delete(team, "alice", "/models/tiny/versions/1").status_code == 200
    moves = team.get("root", "/audit", params={"action": "model.alias"}).json()["entries"]
    assert [(e["actor"], e["target"]) for e in moves] == [
        ("root", "tiny@prod"),
        ("alice", "tiny@prod"),
    ]


def test_an_admin_gives_a_model_to_another_user(team: Team) -> None:
    assert "only admins" in refused(put(team, "alice", "/models/tiny/owner", json={"owner": "bob"}))
    assert "only admins" in refused(put(team, "bob", "/models/tiny/owner", json={"owner": "bob"}))
    refused(put(team, "root", "/models/tiny/owner", json={"owner": "nobody"}), 404)
    for bad in ('""', '"Bob"', '"bob\\u0000"', '"b\\ud800b"', f'"{"x" * 65}"', "7"):
        body = f'{{"owner": {bad}}}'.encode()
        headers = {**team.h("root"), "Content-Type": "application/json"}
        refused(team.api.put("/api/v1/models/tiny/owner", content=body, headers=headers), 422)
    refused(put(team, "root", "/models/nothing/owner", json={"owner": "bob"}), 404)
    # a cross-site page, even with the admin's cookie or token, changes nothing
    sneaky = page_request(
        team.api,
        "PUT",
        "/api/v1/models/tiny/owner",
        json={"owner": "bob"},
        headers={**team.h("root"), **CROSS_SITE},
    )
    assert sneaky.status_code == 403 and sneaky.json()["error"]["code"] == "cross_origin"
    assert team.get("alice", "/models/tiny").json()["model"]["owner"] == "alice"

    given = put(team, "root", "/models/tiny/owner", json={"owner": "bob"})
    assert given.status_code == 200, given.text
    assert given.json()["owner"] == "bob"
    assert put(team, "bob", "/models/tiny/aliases/prod", json={"version": 2}).status_code == 200
    refused(put(team, "alice", "/models/tiny/aliases/prod", json={"version": 1}))
    (entry,) = team.get("root", "/audit", params={"action": "model.transfer"}).json()["entries"]
    assert (entry["actor"], entry["target"], entry["detail"]) == (
        "root",
        "tiny",
        {"owner": "bob", "previous": "alice"},
    )
