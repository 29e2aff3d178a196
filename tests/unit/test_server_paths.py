"""Where the server keeps a job's files is for admins: with auth on, a job's ``job_dir`` and its
checkpoint list's ``directory`` are null for everyone else (as ``/health`` hides ``home``), and
the CLI's ``show``, ``checkpoints`` and ``submit`` summary do without them. With auth off every
caller is an admin and sees them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.support.api import BASE_URL, InProcessTransport
from tests.support.team import Team, make_team
from trainhouse.cli import options as cli_options
from trainhouse.cli.app import app as cli_app
from trainhouse.cli.jobs import summary
from trainhouse.client import Client
from trainhouse.core.wire import CLIENT_HEADERS


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    """A team whose members and viewers see every job, read-only (--job-visibility all)."""
    yield from make_team(tmp_path, job_visibility="all")


@pytest.fixture
def job(team: Team) -> int:
    """Alice's job, with one checkpoint on record."""
    job_id: int = team.submit("alice").json()["id"]
    team.rt.store.checkpoints.add(
        job_id, attempt=1, step=3, path="step-3.pt", size=1, sha256="0" * 64
    )
    return job_id


def paths(team: Team, user: str, job: int) -> tuple[Any, Any]:
    detail = team.get(user, f"/jobs/{job}")
    listing = team.get(user, f"/jobs/{job}/checkpoints")
    assert detail.status_code == listing.status_code == 200, (detail.text, listing.text)
    return detail.json()["job_dir"], listing.json()["directory"]


def test_only_admins_see_where_a_job_is_kept(team: Team, job: int) -> None:
    for user in ("alice", "bob", "vera"):  # its owner, another member, a viewer
        assert paths(team, user, job) == (None, None), user
    job_dir, directory = paths(team, "root", job)
    assert job_dir == str(team.rt.files(job).root)
    assert directory == team.rt.checkpoints.location(job)
    assert str(team.rt.settings.home) in job_dir


def client_as(team: Team, user: str) -> Client:
    client = Client(BASE_URL, token=team.tokens[user])
    client._http.close()
    client._http = httpx.Client(
        base_url=f"{BASE_URL}/api/v1",
        headers={**CLIENT_HEADERS, **team.h(user)},
        transport=InProcessTransport(team.api),
    )
    return client


def test_the_cli_shows_a_job_without_its_paths(
    team: Team, job: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_options, "client", lambda url=None: client_as(team, "alice"))
    monkeypatch.setenv("COLUMNS", "400")  # no path folded across lines
    runner = CliRunner()
    home = str(team.rt.settings.home)
    shown = runner.invoke(cli_app, ["show", str(job)])
    assert shown.exit_code == 0, shown.output
    assert "alice" in shown.output and home not in shown.output and "None" not in shown.output
    listed = runner.invoke(cli_app, ["checkpoints", str(job)])
    assert listed.exit_code == 0, listed.output
    assert "step-3.pt" in listed.output and home not in listed.output
    assert "None" not in listed.output

    with client_as(team, "alice") as c:
        summary({**c.job(job), "state": "COMPLETED"})
    printed = capsys.readouterr().out
    assert f"trainhouse logs {job}" in printed and "None" not in printed
