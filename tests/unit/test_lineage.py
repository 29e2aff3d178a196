"""Resume and clone through the real app in process (the fake executor), the store's side on
both backends, and who may do them (auth on)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.support.api import (
    BASE_URL,
    InProcessTransport,
    app_client,
    error_of,
    services,
    submit,
    wait_launched,
    wait_state,
)
from tests.support.api import workdir as packed
from tests.support.records import old_store
from tests.support.team import Team, make_team, refused
from trainhouse.client import Client
from trainhouse.core.wire import CLIENT_HEADERS
from trainhouse.errors import InvalidTransition, StoreError
from trainhouse.lifecycle import JobState
from trainhouse.store import Store

SPEC = "name: lin\nentrypoint: python train.py\nmax_restarts: 0\nhparams: {lr: 0.1}\n"


@contextmanager
def in_process_client(api: TestClient) -> Iterator[Client]:
    """The Python client, its requests answered by ``api`` in this process."""
    client = Client(BASE_URL)
    client._http.close()
    client._http = httpx.Client(
        base_url=f"{BASE_URL}/api/v1", headers=CLIENT_HEADERS, transport=InProcessTransport(api)
    )
    with client:
        yield client


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    """Attempts run until the test ends them (``fake.end``)."""
    with app_client(tmp_path, exit_code=None) as client:
        yield client


def checkpoint(api: TestClient, job_id: int, step: int, data: bytes, attempt: int = 1) -> Path:
    """A checkpoint file of ``job_id`` as the SDK leaves it, registered."""
    rt = services(api)
    directory = Path(rt.checkpoints.location(job_id))
    directory.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:09d}.pt"
    (directory / name).write_bytes(data)
    rt.store.checkpoints.add(
        job_id,
        attempt=attempt,
        step=step,
        path=name,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        metrics={"val_loss": 0.5},
    )
    return directory / name


def run_and_end(api: TestClient, spec: str, tmp_path: Path, code: int) -> dict[str, Any]:
    job = submit(api, spec, packed(tmp_path)).json()
    wait_launched(api, job["id"])
    checkpoint(api, job["id"], 5, b"five")
    checkpoint(api, job["id"], 10, b"ten!")
    services(api).scheduler.executor.end(job["id"], code)  # type: ignore[attr-defined]
    return wait_state(api, job["id"], {"FAILED", "COMPLETED"})  # type: ignore[no-any-return]


def test_a_failed_job_resumes_as_the_same_job(api: TestClient, tmp_path: Path) -> None:
    failed = run_and_end(api, SPEC, tmp_path, 3)
    job_id = failed["id"]
    assert failed["state"] == "FAILED" and failed["exit_code"] == 3 and failed["resumes"] == 0

    resumed = api.post(f"/api/v1/jobs/{job_id}/resume")
    assert resumed.status_code == 200, resumed.text
    body = resumed.json()
    assert body["id"] == job_id and body["resumes"] == 1
    assert body["exit_code"] is None and body["ended_at"] is None
    running = wait_launched(api, job_id)
    assert running["attempts"] == 2  # the same job's next attempt, its counters going on
    shown = api.get(f"/api/v1/jobs/{job_id}").json()
    assert [e["to_state"] for e in shown["events"]][-3:] == ["FAILED", "QUEUED", "RUNNING"]
    assert "from its checkpoint of step 10" in shown["events"][-2]["reason"]

    services(api).scheduler.executor.end(job_id, 0)  # type: ignore[attr-defined]
    assert wait_state(api, job_id, {"COMPLETED"})["resumes"] == 1
    refused_ = api.post(f"/api/v1/jobs/{job_id}/resume")
    assert refused_.status_code == 409
    assert "it completed; `trainhouse clone" in error_of(refused_)["message"]


def reason_of_last_resume(api: TestClient, job_id: int) -> str:
    events = api.get(f"/api/v1/jobs/{job_id}").json()["events"]
    (last,) = [e for e in events if e["from_state"] in ("FAILED", "CANCELED")][-1:]
    return str(last["reason"])


def test_a_resume_names_the_local_user_without_auth(
    api: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With auth off the resumer is the name the client sends (its local user), else the
    owner: never "anonymous". Each resumed attempt is ended before the next resume."""
    job_id = run_and_end(api, SPEC, tmp_path, 3)["id"]
    fake = services(api).scheduler.executor

    def fail_again() -> None:
        wait_launched(api, job_id)
        fake.end(job_id, 1)  # type: ignore[attr-defined]
        wait_state(api, job_id, {"FAILED"})

    # the Python client (as `trainhouse resume` uses it) sends its process's user
    monkeypatch.setenv("LOGNAME", "carol")
    with in_process_client(api) as client:
        assert client.resume(job_id)["resumes"] == 1
    assert reason_of_last_resume(api, job_id) == "resumed by carol from its checkpoint of step 10"
    fail_again()

    # no name sent (the dashboard's button): the job's owner
    assert api.post(f"/api/v1/jobs/{job_id}/resume").status_code == 200
    assert reason_of_last_resume(api, job_id) == "resumed by tester from its checkpoint of step 10"
    fail_again()

    # a name is a short line of text
    for bad in ("", "a\nb", "x" * 129):
        resp = api.post(f"/api/v1/jobs/{job_id}/resume", json={"by": bad})
        assert resp.status_code == 422, resp.text
    resp = api.post(f"/api/v1/jobs/{job_id}/resume", json={"by": "dave", "as": "root"})
    assert resp.status_code == 422, resp.text
    resp = api.post(f"/api/v1/jobs/{job_id}/resume", json={"by": "dave"})
    assert resp.status_code == 200, resp.text
    assert reason_of_last_resume(api, job_id) == "resumed by dave from its checkpoint of step 10"


def test_resume_is_refused_with_a_reason(api: TestClient, tmp_path: Path) -> None:
    job = submit(api, SPEC, packed(tmp_path)).json()
    wait_launched(api, job["id"])
    running = api.post(f"/api/v1/jobs/{job['id']}/resume")
    assert running.status_code == 409
    assert "RUNNING: it has not ended" in error_of(running)["message"]
    services(api).scheduler.executor.end(job["id"], 1)  # type: ignore[attr-defined]
    wait_state(api, job["id"], {"FAILED"})
    none = api.post(f"/api/v1/jobs/{job['id']}/resume")
    assert none.status_code == 409
    assert "has no checkpoint to resume from" in error_of(none)["message"]
    assert api.post("/api/v1/jobs/999/resume").status_code == 404


def test_clone_copies_the_checkpoint_verified(api: TestClient, tmp_path: Path) -> None:
    source = run_and_end(api, SPEC, tmp_path, 0)
    resp = api.post(
        f"/api/v1/jobs/{source['id']}/clone",
        json={"set": ["hparams.lr=0.5", "name=lin-b"], "from_checkpoint": "latest"},
    )
    assert resp.status_code == 201, resp.text
    new = resp.json()
    assert new["id"] != source["id"] and new["name"] == "lin-b"
    assert new["spec"]["hparams"] == {"lr": 0.5} and new["spec"]["max_restarts"] == 0
    assert new["archive_sha256"] == source["archive_sha256"]  # the same code, not uploaded
    assert (new["cloned_from"], new["cloned_step"], new["held"]) == (source["id"], 10, False)

    rt = services(api)
    (copied,) = rt.store.checkpoints.list(new["id"])
    assert (copied.step, copied.attempt, copied.size) == (10, 0, 4)
    assert copied.sha256 == hashlib.sha256(b"ten!").hexdigest()
    directory = Path(rt.checkpoints.location(new["id"]))
    assert (directory / copied.path).read_bytes() == b"ten!"
    record = json.loads((directory / f"{copied.path}.json").read_text())
    assert record["copied_from"] == {"job": source["id"], "step": 10}
    assert not [p for p in directory.iterdir() if ".tmp-" in p.name]

    shown = api.get(f"/api/v1/jobs/{source['id']}").json()
    assert [(c["id"], c["cloned_step"]) for c in shown["clones"]] == [(new["id"], 10)]
    fresh = api.post(f"/api/v1/jobs/{source['id']}/clone", json={"from_checkpoint": "5"})
    assert fresh.json()["cloned_step"] == 5
    plain = api.post(f"/api/v1/jobs/{source['id']}/clone").json()
    assert plain["cloned_step"] is None and rt.store.checkpoints.list(plain["id"]) == []


def test_clone_refusals_leave_no_job(api: TestClient, tmp_path: Path) -> None:
    source = run_and_end(api, SPEC, tmp_path, 0)
    url = f"/api/v1/jobs/{source['id']}/clone"
    before = api.get("/api/v1/jobs", params={"all": "true"}).json()["total"]
    missing = api.post(url, json={"from_checkpoint": "7"})
    assert missing.status_code == 404
    assert "no checkpoint of step 7; its steps: 5, 10" in error_of(missing)["message"]
    bad = api.post(url, json={"set": ["resources.procs_per_node=0"]})
    assert bad.status_code == 422 and "procs_per_node" in error_of(bad)["message"]
    assert api.post(url, json={"from_checkpoint": "soon"}).status_code == 422
    assert api.post(url, json={"sets": []}).status_code == 422

    # the newest checkpoint changed on disk after it was registered: the copy is refused
    path = Path(services(api).checkpoints.location(source["id"])) / "step-000000010.pt"
    path.write_bytes(b"TEN!")
    corrupt = api.post(url, json={"from_checkpoint": "latest"})
    assert corrupt.status_code == 422
    assert "is corrupt" in error_of(corrupt)["message"]
    assert api.get("/api/v1/jobs", params={"all": "true"}).json()["total"] == before


def test_a_held_job_is_not_scheduled(api: TestClient, tmp_path: Path) -> None:
    rt = services(api)
    archive = submit(api, SPEC, packed(tmp_path)).json()["archive_sha256"]
    held = rt.store.jobs.create(
        name="held",
        owner="x",
        priority="normal",
        spec={"entrypoint": "x"},
        archive_sha256=archive,
        hold=True,
    )
    snap, _ = rt.scheduler.snapshot()
    assert held.id not in {q.id for q in snap.queued}
    rt.store.jobs.discard(held.id)
    with pytest.raises(StoreError, match="not a held job"):
        rt.store.jobs.discard(1)


def test_a_clone_interrupted_during_its_copy_is_discarded_by_the_next_server(
    tmp_path: Path,
) -> None:
    """The server stops while a clone's checkpoint is copied (the clone held, a partial copy
    on disk): the next server deletes both, and the clone never waits forever."""
    with app_client(tmp_path, exit_code=None) as api:  # attempts end when the test says
        rt = services(api)
        source = run_and_end(api, SPEC, tmp_path, 0)
        clone = rt.store.jobs.create(
            name="lin",
            owner="x",
            priority="normal",
            spec={"entrypoint": "python train.py"},
            archive_sha256=source["archive_sha256"],
            cloned_from=source["id"],
            cloned_step=10,
            hold=True,
        )
        partial = Path(rt.checkpoints.location(clone.id)) / "step-000000010.pt.tmp-1"
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(b"te")
    with app_client(tmp_path, exit_code=None) as api:
        rt = services(api)
        assert [j.id for j in rt.store.jobs.list()] == [source["id"]]
        assert not partial.exists()
        assert api.get(f"/api/v1/jobs/{source['id']}").json()["clones"] == []


def test_the_store_resumes_through_the_lifecycle(store: Store) -> None:
    job = store.jobs.create(
        name="j", owner="o", priority="normal", spec={"entrypoint": "x"}, archive_sha256="a"
    )
    with pytest.raises(InvalidTransition):
        store.jobs.resume(job.id, by="o", checkpoint_step=1)  # QUEUED: nothing to resume
    store.jobs.transition(job.id, JobState.CANCELED, reason="canceled by request")
    store.jobs.update(job.id, cancel_requested=True)
    resumed = store.jobs.resume(job.id, by="o", checkpoint_step=4)
    assert (resumed.state, resumed.resumes, resumed.cancel_requested) == ("QUEUED", 1, False)
    assert (
        resumed.ended_at is None and resumed.reason == "resumed by o from its checkpoint of step 4"
    )
    clone = store.jobs.create(
        name="c",
        owner="p",
        priority="normal",
        spec={"entrypoint": "x"},
        archive_sha256="a",
        cloned_from=job.id,
        cloned_step=4,
        hold=True,
    )
    assert clone.held and store.jobs.events(clone.id)[0].reason == (
        f"cloned from job {job.id} (its checkpoint of step 4)"
    )
    assert not store.jobs.release(clone.id).held
    assert [c.id for c in store.jobs.clones(job.id)] == [clone.id]


def test_jobs_from_before_0011_were_never_resumed_nor_cloned(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old_store(url, "0008").close()
    store = Store(url)
    try:
        job = store.jobs.get(1)
        assert (job.resumes, job.cloned_from, job.cloned_step, job.held) == (0, None, None, False)
    finally:
        store.close()


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    yield from make_team(tmp_path, job_visibility="all")


def test_only_the_owner_or_an_admin_resumes(team: Team) -> None:
    job = team.submit("alice").json()
    assert team.post("alice", f"/jobs/{job['id']}/cancel").json()["state"] == "CANCELED"
    team.rt.store.checkpoints.add(job["id"], attempt=1, step=3, path="p", size=1, sha256="0" * 64)
    assert "may not change it" in refused(team.post("bob", f"/jobs/{job['id']}/resume"))
    assert "viewer" in refused(team.post("vera", f"/jobs/{job['id']}/resume"))
    # with auth on the token's user resumes: a name claimed in the body is ignored
    resumed = team.post("root", f"/jobs/{job['id']}/resume", json={"by": "mallory"})
    assert resumed.status_code == 200 and resumed.json()["resumes"] == 1
    events = team.get("alice", f"/jobs/{job['id']}").json()["events"]
    assert events[-1]["reason"] == "resumed by root from its checkpoint of step 3"
    # a reader may clone: the clone is theirs
    clone = team.post("bob", f"/jobs/{job['id']}/clone")
    assert clone.status_code == 201 and clone.json()["owner"] == "bob"
    assert "viewer" in refused(team.post("vera", f"/jobs/{job['id']}/clone"))
