"""The runs table through REST, the client and the CLI, in process: columns, filters and sorts
on hparams and metric summaries, projects and tags, notes, archiving, deleting (rows and
files), the hparams a run reports with the spec keys it never reads, pandas frames, and who
may do what (auth on)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.support.api import BASE_URL, InProcessTransport, services
from tests.support.records import WAIT, new_job
from tests.support.team import Team, make_team, refused
from trainhouse.cli import options as cli_options
from trainhouse.cli import render
from trainhouse.cli.app import app as cli_app
from trainhouse.client import Client
from trainhouse.core.records import MetricPoint
from trainhouse.core.tokens import hash_token
from trainhouse.core.wire import CLIENT_HEADERS
from trainhouse.lifecycle import JobState
from trainhouse.store import Store

AUTH = {"Authorization": "Bearer known"}


def sweep(store: Store) -> list[int]:
    """Three ended jobs of a sweep (lr, optimizer, val_loss) and a queued one without any.
    Each waits for GPUs the server does not have, so the scheduler leaves them queued."""
    jobs = []
    for i, (lr, loss) in enumerate([(1e-2, 0.3), (1e-3, 0.05), (1e-4, 0.2)]):
        spec = {
            **WAIT,
            "project": "vision" if i < 2 else "nlp",
            "tags": ["sweep", f"s{i}"],
            "hparams": {"lr": lr, "optim": "adam" if i != 1 else "sgd"},
        }
        job = new_job(store, name=f"run{i}", spec=spec)
        store.metrics.add(job, [MetricPoint(s, "val_loss", loss * (3 - s)) for s in range(3)])
        store.jobs.transition(job, JobState.CANCELED, reason="test")
        jobs.append(job)
    jobs.append(new_job(store, name="waiting", spec=WAIT))
    return jobs


def in_process(api: TestClient) -> Client:
    client = Client(BASE_URL)
    client._http.close()
    client._http = httpx.Client(
        base_url=f"{BASE_URL}/api/v1", headers=CLIENT_HEADERS, transport=InProcessTransport(api)
    )
    return client


def test_list_columns_filters_sorts_and_errors(api: TestClient) -> None:
    rt = services(api)
    a, b, c, waiting = sweep(rt.store)
    get = lambda **params: api.get("/api/v1/jobs", params=params)  # noqa: E731

    resp = get(
        where="metrics.val_loss.min < 0.2 and hparams.lr >= 1e-3",
        columns="hparams.lr,metrics.val_loss.min,metrics.val_loss.last,hparams.nope",
        sort="metrics.val_loss.min",
        order="asc",
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [j["id"] for j in body["jobs"]] == [b] and body["total"] == 1
    assert body["columns"] == [
        "hparams.lr",
        "metrics.val_loss.min",
        "metrics.val_loss.last",
        "hparams.nope",
    ]
    assert body["jobs"][0]["values"] == {
        "hparams.lr": 1e-3,
        "metrics.val_loss.min": pytest.approx(0.05),
        "metrics.val_loss.last": pytest.approx(0.05),
    }
    assert body["jobs"][0]["tags"] == ["s1", "sweep"] and body["jobs"][0]["project"] == "vision"

    # without a filter the default list is the unfinished jobs, as before; a filter lists all
    assert [j["id"] for j in get().json()["jobs"]] == [waiting]
    assert [j["id"] for j in get(project="vision").json()["jobs"]] == []
    assert [j["id"] for j in get(project="vision", all="true").json()["jobs"]] == [b, a]
    assert [j["id"] for j in get(tag=["sweep", "s2"], all="true").json()["jobs"]] == [c]
    desc = get(sort="hparams.lr", all="true").json()["jobs"]
    assert [j["id"] for j in desc] == [a, b, c, waiting]  # no value: last

    resp = get(where="metrics.val_loss.min < and state = COMPLETED")
    assert resp.status_code == 422
    message = resp.json()["error"]["message"]
    assert "column 24" in message and message.endswith(" " * 25 + "^"), message
    for bad in ({"sort": "metrics.loss"}, {"columns": "hparams."}, {"where": "state = DONE"}):
        resp = get(**bad)
        assert resp.status_code == 422, (bad, resp.text)
        assert resp.json()["error"]["code"] == "invalid_request"

    picker = api.get("/api/v1/runs/columns").json()
    assert picker == {
        "hparams": ["lr", "optim"],
        "metrics": ["val_loss"],
        "projects": ["default", "nlp", "vision"],
        "tags": ["s0", "s1", "s2", "sweep"],
    }


def test_tags_note_archive_and_delete(api: TestClient, tmp_path: Path) -> None:
    rt = services(api)
    a, b, _c, waiting = sweep(rt.store)
    resp = api.post(f"/api/v1/jobs/{a}/tags", json={"add": ["best", "best"], "remove": ["s0"]})
    assert resp.json() == {"job_id": a, "tags": ["best", "sweep"]}
    resp = api.post(f"/api/v1/jobs/{a}/tags", json={"add": ["no spaces"]})
    assert resp.status_code == 422 and "tag 'no spaces'" in resp.json()["error"]["message"]

    resp = api.put(f"/api/v1/jobs/{a}/note", json={"note": "## why\nlr too **high**"})
    assert resp.status_code == 200 and resp.json()["note"] == "## why\nlr too **high**"
    assert api.get(f"/api/v1/jobs/{a}").json()["note"] == "## why\nlr too **high**"
    assert api.put(f"/api/v1/jobs/{a}/note", json={"note": "x\x00"}).status_code == 422

    # moved to another project: the list's project filter follows; a bad name is refused
    resp = api.put(f"/api/v1/jobs/{a}/project", json={"project": "nlp"})
    assert resp.status_code == 200 and resp.json()["project"] == "nlp", resp.text
    nlp = api.get("/api/v1/jobs", params={"all": "true", "project": "nlp"}).json()["jobs"]
    assert sorted(j["id"] for j in nlp) == sorted([a, _c])
    for bad in ("", "no spaces", "-dash", "x" * 129, "nlp\n"):
        resp = api.put(f"/api/v1/jobs/{a}/project", json={"project": bad})
        assert resp.status_code == 422, (bad, resp.text)
    assert api.get(f"/api/v1/jobs/{a}").json()["project"] == "nlp"

    resp = api.post(f"/api/v1/jobs/{waiting}/archive", json={"archived": True})
    assert resp.status_code == 409 and "only an ended job" in resp.json()["error"]["message"]
    assert api.post(f"/api/v1/jobs/{a}/archive", json={}).json()["archived"] is True
    listed = api.get("/api/v1/jobs", params={"all": "true"}).json()["jobs"]
    assert a not in [j["id"] for j in listed]
    only = api.get("/api/v1/jobs", params={"archived": "only"}).json()["jobs"]
    assert [j["id"] for j in only] == [a]

    # delete: refused while not ended; the rows and the files go, and the bytes are counted
    resp = api.delete(f"/api/v1/jobs/{waiting}")
    assert resp.status_code == 409 and "cancel it first" in resp.json()["error"]["message"]
    files = rt.files(b)
    files.logs.mkdir(parents=True)
    (files.logs / "rank0.log").write_bytes(b"x" * 5000)
    files.checkpoints.mkdir(parents=True)
    (files.checkpoints / "step-1.pt").write_bytes(b"y" * 3000)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (files.root / "link").symlink_to(outside)
    resp = api.delete(f"/api/v1/jobs/{b}")
    assert resp.status_code == 200, resp.text
    gone = resp.json()
    assert gone["bytes_freed"] == 8000 and gone["rows"]["metrics"] == 3
    assert not files.root.exists() and outside.read_text() == "keep me"
    assert api.get(f"/api/v1/jobs/{b}").status_code == 404
    assert api.delete(f"/api/v1/jobs/{b}").status_code == 404
    audit = rt.store.accounts.audit_entries(actions=["job.delete"])[0]
    assert [e.target for e in audit] == [f"job:{b}"]


def test_the_hparams_a_run_reports_and_the_keys_it_never_reads(api: TestClient) -> None:
    rt = services(api)
    job = new_job(rt.store, spec={**WAIT, "hparams": {"epocs": 3, "lr": 0.1}})
    rt.store.jobs.transition(job, JobState.CANCELED, reason="test")
    rt.store.jobs.update(job, token_hash=hash_token("known"))
    body = {"hparams": {"epochs": 10, "lr": 0.1, "epocs": 3}, "script_keys": ["epochs", "lr"]}
    assert api.post(f"/api/v1/jobs/{job}/hparams", json=body).status_code == 401
    resp = api.post(f"/api/v1/jobs/{job}/hparams", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    warning = (
        "warning: hparams.epocs was set but the script's hparams are: epochs, lr "
        "(did you mean 'epochs'?)"
    )
    assert resp.json() == {"job_id": job, "unread": ["epocs"], "warnings": [warning]}
    api.post(f"/api/v1/jobs/{job}/hparams", json=body, headers=AUTH)  # noted once
    shown = api.get(f"/api/v1/jobs/{job}").json()
    assert [e["reason"] for e in shown["events"]].count(warning) == 1
    assert shown["hparams"] == {"epochs": 10, "lr": 0.1, "epocs": 3}
    listed = api.get(
        "/api/v1/jobs", params={"where": "hparams.epochs = 10", "columns": "hparams.epochs"}
    )
    assert [j["values"] for j in listed.json()["jobs"]] == [{"hparams.epochs": 10.0}]
    # nothing known about the script's keys: nothing flagged
    resp = api.post(f"/api/v1/jobs/{job}/hparams", json={"hparams": {"x": 1}}, headers=AUTH)
    assert resp.json()["unread"] == []
    resp = api.post(
        f"/api/v1/jobs/{job}/hparams", json={"hparams": {"x": "y" * 70_000}}, headers=AUTH
    )
    assert resp.status_code == 422 and "at most 64 KiB" in resp.json()["error"]["message"]


def test_client_frames_and_cli(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    pd = pytest.importorskip("pandas")
    rt = services(api)
    a, b, c, waiting = sweep(rt.store)
    rt.store.metrics.add(a, [MetricPoint(1, "acc", 0.5), MetricPoint(4, "acc", float("nan"))])
    client = in_process(api)
    everything = client.jobs()  # every job the caller may see, ended ones too
    assert [j["id"] for j in everything] == [waiting, c, b, a] and everything.total == 4
    page = client.jobs(
        where="project = vision", columns=["hparams.lr", "metrics.val_loss.min"], page_size=1
    )
    assert [j["id"] for j in page] == [b, a]  # fetched a page of 1 at a time
    frame = page.to_pandas()
    assert list(frame["id"]) == [b, a]
    assert list(frame["hparams.lr"]) == [1e-3, 1e-2]
    assert list(frame["hparams.optim"]) == ["sgd", "adam"]
    assert frame["metrics.val_loss.min"].tolist() == pytest.approx([0.05, 0.3])
    assert str(frame["created_at"].dtype).startswith("datetime64")

    metrics = client.metrics(a)
    history = metrics.history()
    assert list(history.columns) == ["step", "wall_time", "acc", "val_loss"]
    assert history["step"].tolist() == [0, 1, 2, 4]
    assert history["val_loss"].tolist()[:3] == pytest.approx([0.9, 0.6, 0.3])
    assert pd.isna(history["acc"][0]) and pd.isna(history["acc"][3])  # none; NaN logged
    long = metrics.to_pandas()
    assert len(long) == 5 and set(long["name"]) == {"acc", "val_loss"}
    assert metrics["series"][0]["name"] in ("acc", "val_loss")  # still the dict it was
    client.close()

    monkeypatch.setattr(cli_options, "client", lambda url=None: in_process(api))
    # the console took its width once, from whichever test imported the CLI first
    monkeypatch.setattr(render.console, "width", 250)
    runner = CliRunner()
    out = runner.invoke(
        cli_app,
        [
            "ps",
            "--where",
            "hparams.lr >= 1e-3",
            "--columns",
            "hparams.lr,metrics.val_loss.min,tag",
            "--sort",
            "metrics.val_loss.min",
            "--asc",
        ],
        env={"COLUMNS": "250"},
    )
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert "hparams.lr" in lines[0] and "metrics.val_loss.min" in lines[0]
    assert lines[1].split()[0] == str(b) and "0.001" in lines[1] and "s1,sweep" in lines[1]
    rows = [line.split()[0] for line in lines[1:] if line.split()[0].isdigit()]
    assert rows == [str(b), str(a)]
    bad = runner.invoke(cli_app, ["ps", "--where", "lr >"])
    assert bad.exit_code == 2 and "unknown field 'lr'" in bad.output

    out = runner.invoke(cli_app, ["tag", str(a), "best", "--remove", "s0", "--json"])
    assert json.loads(out.output) == {"job_id": a, "tags": ["best", "sweep"]}
    assert runner.invoke(cli_app, ["note", str(a), "**lr** too high"]).exit_code == 0
    assert "**lr** too high" in runner.invoke(cli_app, ["note", str(a)]).output
    assert "**lr** too high" in runner.invoke(cli_app, ["show", str(a)]).output
    assert runner.invoke(cli_app, ["archive", str(a)]).exit_code == 0
    listed = runner.invoke(cli_app, ["ps", "--all", "--json"])
    assert a not in [j["id"] for j in json.loads(listed.output)]
    listed = runner.invoke(cli_app, ["ps", "--all", "--archived", "--json"])
    assert a in [j["id"] for j in json.loads(listed.output)]
    refused_delete = runner.invoke(cli_app, ["delete", str(a)], input="")
    assert refused_delete.exit_code == 1 and "--yes" in refused_delete.output
    out = runner.invoke(cli_app, ["delete", str(a), "--yes"])
    assert out.exit_code == 0 and f"job {a} deleted" in out.output, out.output


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    yield from make_team(tmp_path, job_visibility="list")


def test_who_may_read_and_change_what(team: Team) -> None:
    ids = {}
    for user, lr in (("alice", 0.1), ("bob", 0.2)):
        resp = team.submit(user, name=f"{user}-run", extra=f"hparams: {{lr: {lr}}}\ntags: [t]\n")
        assert resp.status_code == 201, resp.text
        ids[user] = resp.json()["id"]
    team.rt.store.jobs.transition(ids["bob"], JobState.CANCELED, reason="test")
    # alice lists bob's job but filters and columns see her own jobs' hparams only
    listed = team.get("alice", "/jobs", params={"where": "hparams.lr > 0", "columns": "hparams.lr"})
    assert [(j["id"], j["values"]) for j in listed.json()["jobs"]] == [
        (ids["alice"], {"hparams.lr": 0.1})
    ]
    listed = team.get("alice", "/jobs", params={"all": "true", "columns": "hparams.lr"})
    values = {j["id"]: j["values"] for j in listed.json()["jobs"]}
    assert values == {ids["alice"]: {"hparams.lr": 0.1}, ids["bob"]: {}}
    assert team.get("root", "/jobs", params={"where": "hparams.lr > 0"}).json()["total"] == 2

    bob_job = ids["bob"]
    # a note is text only who may read the job sees: a filter on it sees her own jobs only
    assert team.api.put(
        f"/api/v1/jobs/{bob_job}/note", json={"note": "secret plan"}, headers=team.h("bob")
    ).is_success
    found = team.get("alice", "/jobs", params={"all": "true", "where": "note ~ secret"})
    assert found.json()["total"] == 0
    found = team.get("root", "/jobs", params={"all": "true", "where": "note ~ secret"})
    assert [j["id"] for j in found.json()["jobs"]] == [bob_job]
    refused(
        team.api.put(
            f"/api/v1/jobs/{bob_job}/project", json={"project": "x"}, headers=team.h("alice")
        )
    )
    refused(team.post("alice", f"/jobs/{bob_job}/tags", json={"add": ["x"]}))
    refused(
        team.api.put(f"/api/v1/jobs/{bob_job}/note", json={"note": "x"}, headers=team.h("alice"))
    )
    refused(team.post("vera", f"/jobs/{bob_job}/archive", json={}))
    refused(team.api.delete(f"/api/v1/jobs/{bob_job}", headers=team.h("alice")))
    assert team.post("bob", f"/jobs/{bob_job}/tags", json={"add": ["x"]}).status_code == 200
    resp = team.api.delete(f"/api/v1/jobs/{bob_job}", headers=team.h("root"))
    assert resp.status_code == 200, resp.text
    entries = team.rt.store.accounts.audit_entries(actions=["job.delete"])[0]
    assert [(e.actor, e.target) for e in entries] == [("root", f"job:{bob_job}")]
