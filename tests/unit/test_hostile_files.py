"""Files a job leaves behind are hostile input: the real app in process, over the suite's fake
executor, with FIFOs, links, sockets and hard links where the server expects checkpoints,
sidecars, spooled metrics and logs. The scheduler keeps ticking, no API thread waits, nothing is
read or deleted through a link."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import (
    app_client,
    error_of,
    services,
    submit,
    wait_launched,
    wait_state,
    workdir,
)
from tests.support.hostile import Fifos, finishes, socket_file
from trainhouse.core.tokens import hash_token
from trainhouse.ingest.logretention import expire_logs
from trainhouse.jobfs.layout import JobLayout

AUTH = {"Authorization": "Bearer known"}
SPEC = "entrypoint: python train.py\ncheckpoints: {keep_last: 2}\n"


def new_job(api: TestClient, tmp_path: Path, until: str = "COMPLETED", spec: str = SPEC) -> Any:
    """A job in state ``until`` whose credential is "known": its id, API URL, checkpoint
    directory and job directory."""
    created = submit(api, spec, workdir(tmp_path)).json()
    if until == "RUNNING":
        wait_launched(api, created["id"])
    else:
        wait_state(api, created["id"], {until})
    rt = services(api)
    rt.store.jobs.update(created["id"], token_hash=hash_token("known"))
    url = f"/api/v1/jobs/{created['id']}"
    shown = api.get(url).json()
    location = api.get(f"{url}/checkpoints").json()["directory"]  # a path or a file:// URL
    directory = Path(location.removeprefix("file://"))
    directory.mkdir(parents=True, exist_ok=True)
    return {"id": created["id"], "url": url, "dir": directory, "root": Path(shown["job_dir"])}


def register(
    api: TestClient, job: Any, path: str, size: int, sha: str = "0" * 64, kind: str = "file"
) -> Any:
    body = {"attempt": 1, "step": 1, "path": path, "size": size, "sha256": sha, "kind": kind}
    return api.post(f"{job['url']}/checkpoints", json=body, headers=AUTH)


def put(api: TestClient, job: Any, name: str, data: bytes, step: int = 1) -> Any:
    """A file checkpoint ``name`` holding ``data``, written and registered (with its sidecar)."""
    path = job["dir"] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    (job["dir"] / f"{name}.json").write_text("{}")
    body = {
        "attempt": 1,
        "step": step,
        "path": name,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    resp = api.post(f"{job['url']}/checkpoints", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.json()
    services(api).checkpoints.drain()
    return resp.json()


def refused(resp: Any, *words: str) -> None:
    assert resp.status_code == 422, (resp.status_code, resp.text[:300])
    message = error_of(resp)["message"]
    assert all(w in message for w in words), message


# -- the scheduler's thread ----------------------------------------------------------------------
def test_a_fifo_sidecar_does_not_hold_up_the_scheduler(tmp_path: Path, fifos: Fifos) -> None:
    """The review's first finding: a job that left a FIFO named like a checkpoint's record froze
    the scheduler as it recorded the job's end (no job started or ended after it)."""
    with app_client(tmp_path, exit_code=None) as api:
        fake = services(api).scheduler.executor
        try:
            a = new_job(api, tmp_path, until="RUNNING")
            (a["dir"] / "step-000000001.pt").write_bytes(b"weights")
            fifos.make(a["dir"] / "step-000000001.pt.json")
            fake.end(a["id"], 0)  # type: ignore[attr-defined]
            wait_state(api, a["id"], {"COMPLETED"}, timeout=10)
            b = new_job(api, tmp_path, until="RUNNING")  # the next job still starts ...
            fake.end(b["id"], 0)  # type: ignore[attr-defined]
            wait_state(api, b["id"], {"COMPLETED"}, timeout=10)  # ... and ends
        finally:
            fifos.release()
        assert api.get(f"{a['url']}/checkpoints").json()["checkpoints"] == []


def test_a_fifo_in_the_metrics_spool_does_not_hold_up_the_scheduler(
    tmp_path: Path, fifos: Fifos
) -> None:
    with app_client(tmp_path, exit_code=None) as api:
        fake = services(api).scheduler.executor
        try:
            a = new_job(api, tmp_path, until="RUNNING")
            spool = JobLayout(services(api).settings.home, a["id"]).attempt(1).spool
            fifos.make(spool / "00000000000000000001-stuck.json")
            batch = {"batch_id": "b", "attempt": 1, "points": [[3, "loss", 0.5, None, 1.0]]}
            (spool / "00000000000000000002-b.json").write_text(json.dumps(batch))
            fake.end(a["id"], 0)  # type: ignore[attr-defined]
            wait_state(api, a["id"], {"COMPLETED"}, timeout=10)
            b = new_job(api, tmp_path, until="RUNNING")
            fake.end(b["id"], 0)  # type: ignore[attr-defined]
            wait_state(api, b["id"], {"COMPLETED"}, timeout=10)
        finally:
            fifos.release()
        points = api.get(f"{a['url']}/metrics").json()["series"][0]["points"]
        assert [p[0] for p in points] == [3]  # the regular batch was stored
        assert sorted(p.name for p in spool.iterdir()) == ["00000000000000000001-stuck.bad"]


# -- API threads ---------------------------------------------------------------------------------
def test_downloads_of_a_fifo_checkpoint_pin_no_api_thread(
    api: TestClient, tmp_path: Path, fifos: Fifos
) -> None:
    """The review's second finding: 45 abandoned downloads of a checkpoint replaced by a FIFO
    held every thread of the API's pool."""
    job = new_job(api, tmp_path)
    ckpt = put(api, job, "step-000000001.pt", b"weights")
    (job["dir"] / "step-000000001.pt").unlink()
    fifos.make(job["dir"] / "step-000000001.pt")
    url = f"{job['url']}/checkpoints/{ckpt['id']}/content"
    codes: list[int] = []
    threads = [
        threading.Thread(target=lambda: codes.append(api.get(url).status_code), daemon=True)
        for _ in range(45)
    ]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        answered, shown = finishes(lambda: api.get(job["url"]), 5)
        assert answered and shown.status_code == 200, "the API's threads are all taken"
        assert codes == [422] * 45
        refused(api.get(url), "FIFO", "not a regular file")
        refused(api.get(f"{job['url']}/checkpoints/{ckpt['id']}/files"), "FIFO")
    finally:
        fifos.release()
        for t in threads:
            t.join(10)


# -- links: the database, /etc/passwd, another job's files ---------------------------------------
def secret_of(api: TestClient, tmp_path: Path, target: str) -> Path:
    """A file no member may read through a job: the server's database, /etc/passwd, or a
    checkpoint of another job."""
    if target == "database":
        return services(api).settings.home / "trainhouse.db"
    if target == "passwd":
        return Path("/etc/passwd")
    other = new_job(api, tmp_path)
    secret: Path = other["dir"] / "step-000000009.pt"
    secret.write_bytes(b"another user's weights " * 100)
    return secret


@pytest.mark.parametrize("target", ["database", "passwd", "another-job"])
def test_a_checkpoint_that_is_a_link_is_not_registered(
    api: TestClient, tmp_path: Path, target: str
) -> None:
    job = new_job(api, tmp_path)
    secret = secret_of(api, tmp_path, target)
    (job["dir"] / "linked.pt").symlink_to(secret)
    refused(register(api, job, "linked.pt", secret.stat().st_size), "symbolic link")
    (job["dir"] / "sub").symlink_to(secret.parent)  # a link on the way
    refused(register(api, job, f"sub/{secret.name}", secret.stat().st_size), "symbolic link")


@pytest.mark.parametrize("target", ["database", "passwd", "another-job"])
def test_a_checkpoint_replaced_by_a_link_is_not_downloaded(
    api: TestClient, tmp_path: Path, target: str
) -> None:
    """The review's fourth finding: a member downloaded the server's database and /etc/passwd
    through a checkpoint that was a symbolic link."""
    job = new_job(api, tmp_path)
    secret = secret_of(api, tmp_path, target)
    ckpt = put(api, job, "step-000000001.pt", b"x" * secret.stat().st_size)
    (job["dir"] / "step-000000001.pt").unlink()
    (job["dir"] / "step-000000001.pt").symlink_to(secret)
    resp = api.get(f"{job['url']}/checkpoints/{ckpt['id']}/content")
    refused(resp, "symbolic link")
    assert secret.read_bytes()[:64] not in resp.content
    refused(api.get(f"{job['url']}/checkpoints/{ckpt['id']}/files"), "symbolic link")


def test_a_hard_link_to_the_database_is_not_downloaded(api: TestClient, tmp_path: Path) -> None:
    job = new_job(api, tmp_path)
    database = services(api).settings.home / "trainhouse.db"
    os.link(database, job["dir"] / "db.pt")  # same filesystem, same owner: allowed
    refused(register(api, job, "db.pt", database.stat().st_size), "hard links")
    ckpt = put(api, job, "step-000000001.pt", b"x")
    (job["dir"] / "step-000000001.pt").unlink()
    os.link(database, job["dir"] / "step-000000001.pt")
    resp = api.get(f"{job['url']}/checkpoints/{ckpt['id']}/content")
    refused(resp, "hard links")
    assert b"SQLite format 3" not in resp.content


def test_a_sharded_checkpoint_holding_a_link_is_not_registered(
    api: TestClient, tmp_path: Path
) -> None:
    job = new_job(api, tmp_path)
    shards = job["dir"] / "step-000000001"
    (shards / "sub").mkdir(parents=True)
    (shards / "__0_0.distcp").write_bytes(b"rank zero")
    (shards / "sub" / ".metadata").symlink_to("/etc/passwd")
    size = len(b"rank zero") + Path("/etc/passwd").stat().st_size
    refused(register(api, job, "step-000000001", size, kind="sharded"), "symbolic link")


def test_a_link_put_inside_a_sharded_checkpoint_is_not_downloaded(
    api: TestClient, tmp_path: Path
) -> None:
    job = new_job(api, tmp_path)
    shards = job["dir"] / "step-000000001"
    (shards / "sub").mkdir(parents=True)
    (shards / "__0_0.distcp").write_bytes(b"rank zero")
    (shards / "sub" / ".metadata").write_bytes(b"meta")
    resp = register(api, job, "step-000000001", len(b"rank zerometa"), kind="sharded")
    assert resp.status_code == 201, resp.json()
    base = f"{job['url']}/checkpoints/{resp.json()['id']}"
    (shards / "sub" / ".metadata").unlink()
    (shards / "sub" / ".metadata").symlink_to("/etc/passwd")
    refused(api.get(f"{base}/files"), "symbolic link")
    resp = api.get(f"{base}/content", params={"file": "sub/.metadata"})
    refused(resp, "symbolic link")
    assert b"root:" not in resp.content
    # a shard's directory that is a link: nothing is read through it
    shutil.rmtree(shards / "sub")
    (shards / "sub").symlink_to(Path("/etc"))
    refused(api.get(f"{base}/files"), "symbolic link")
    refused(api.get(f"{base}/content", params={"file": "sub/passwd"}), "symbolic link")


def test_a_socket_or_a_directory_where_a_checkpoint_file_should_be(
    api: TestClient, tmp_path: Path
) -> None:
    """Answered with a plain refusal (422), not a server error, and never registered."""
    job = new_job(api, tmp_path)
    socket_file(job["dir"] / "sock.pt")
    refused(register(api, job, "sock.pt", 0), "not a regular file")
    ckpt = put(api, job, "step-000000001.pt", b"weights")
    (job["dir"] / "step-000000001.pt").unlink()
    (job["dir"] / "step-000000001.pt").mkdir()
    (job["dir"] / "step-000000001.pt" / "x").write_bytes(b"weights")
    refused(api.get(f"{job['url']}/checkpoints/{ckpt['id']}/content"), "a directory")
    refused(api.get(f"{job['url']}/checkpoints/{ckpt['id']}/files"), "a directory")


def test_retention_deletes_nothing_through_a_linked_directory(
    api: TestClient, tmp_path: Path
) -> None:
    """The review's fifth finding: checkpoints under a directory the job later replaced by a
    link made retention delete a file and a directory outside the job."""
    job = new_job(api, tmp_path)
    put(api, job, "sub/step-000000001.pt", b"one", step=1)
    shards = job["dir"] / "sub" / "step-000000002"
    shards.mkdir()
    (shards / "__0_0.distcp").write_bytes(b"two")
    digest = hashlib.sha256(f"__0_0.distcp {hashlib.sha256(b'two').hexdigest()} 3\n".encode())
    body = {"path": "sub/step-000000002", "size": 3, "sha256": digest.hexdigest()}
    resp = api.post(
        f"{job['url']}/checkpoints",
        json={"attempt": 1, "step": 2, "kind": "sharded", **body},
        headers=AUTH,
    )
    assert resp.status_code == 201, resp.json()
    outside = tmp_path / "outside"
    shutil.move(job["dir"] / "sub", outside)  # the same names, outside the job
    (job["dir"] / "sub").symlink_to(outside)
    put(api, job, "step-000000003.pt", b"three", step=3)
    put(api, job, "step-000000004.pt", b"four", step=4)  # retention: keep_last 2
    listed = api.get(f"{job['url']}/checkpoints", params={"all": "true"}).json()["checkpoints"]
    assert [c["deleted"] for c in listed] == [True, True, False, False]
    assert (outside / "step-000000001.pt").read_bytes() == b"one"
    assert (outside / "step-000000002" / "__0_0.distcp").read_bytes() == b"two"
    assert (outside / "step-000000001.pt.json").exists()


# -- logs ----------------------------------------------------------------------------------------
def test_a_linked_log_shows_nothing_of_another_job(api: TestClient, tmp_path: Path) -> None:
    """The review's sixth finding: a launcher.log linked to another user's log showed it."""
    job, other = new_job(api, tmp_path), new_job(api, tmp_path)
    (other["root"] / "logs").mkdir(parents=True)
    (other["root"] / "logs" / "launcher.log").write_text("the other job's launcher\n")
    (other["root"] / "logs" / "rank-0.log").write_text("the other job's rank 0\n")
    logs = job["root"] / "logs"
    logs.mkdir(parents=True)
    (logs / "launcher.log").symlink_to(other["root"] / "logs" / "launcher.log")
    (logs / "rank-0.log").symlink_to("/etc/passwd")
    for rank in ("launcher", "0"):
        resp = api.get(f"{job['url']}/logs", params={"rank": rank})
        assert resp.status_code == 200 and resp.text == "", resp.text[:200]
        assert resp.headers["X-Log-Offset"] == "0"
    assert api.get(f"{job['url']}/logs/ranks").json() == {
        "job_id": job["id"],
        "ranks": [],
        "launcher": False,
    }
    stream = api.get(f"{job['url']}/logs/stream", params={"rank": ["0", "launcher"], "tail": 5})
    assert "other job" not in stream.text and "root:" not in stream.text
    assert "event: end" in stream.text
    # the logs directory itself a link to the other job's
    shutil.rmtree(logs)
    logs.symlink_to(other["root"] / "logs")
    for rank in ("launcher", "0"):
        assert api.get(f"{job['url']}/logs", params={"rank": rank}).text == ""
    assert api.get(f"{job['url']}/logs/ranks").json()["launcher"] is False


def test_log_retention_deletes_nothing_through_a_linked_job_directory(
    api: TestClient, tmp_path: Path
) -> None:
    job = new_job(api, tmp_path)
    outside = tmp_path / "outside"
    (outside / "logs").mkdir(parents=True)
    (outside / "logs" / "keep.txt").write_text("not the job's")
    shutil.rmtree(job["root"], ignore_errors=True)
    job["root"].symlink_to(outside)
    rt = services(api)
    expire_logs(rt.store, rt.settings.home, 1.0, now=time.time() + 100)
    assert (outside / "logs" / "keep.txt").read_text() == "not the job's"


def test_a_new_attempt_removes_nothing_through_a_linked_attempt_directory(
    tmp_path: Path,
) -> None:
    """Before a restart the scheduler clears the new attempt's workdir: never through a link
    the previous attempt left in its place (the start fails instead)."""
    with app_client(tmp_path, exit_code=None) as api:
        fake = services(api).scheduler.executor
        job = new_job(api, tmp_path, until="RUNNING", spec=SPEC + "max_restarts: 1\n")
        outside = tmp_path / "outside"
        (outside / "workdir").mkdir(parents=True)
        (outside / "workdir" / "keep.txt").write_text("not the job's")
        (job["root"] / "attempts" / "2").symlink_to(outside)
        fake.end(job["id"], 1)  # type: ignore[attr-defined]
        final = wait_state(api, job["id"], {"FAILED"}, timeout=10)
        assert "could not start attempt 2" in final["reason"]
        assert "symbolic link" in final["reason"]
        assert (outside / "workdir" / "keep.txt").read_text() == "not the job's"


def test_a_record_nested_past_the_parser_does_not_stop_the_others(
    api: TestClient, tmp_path: Path
) -> None:
    """Checkpoints an attempt left unregistered are found by their records: one record that is
    JSON nested too deeply to parse is skipped, the next one still registers."""
    job = new_job(api, tmp_path)
    (job["dir"] / "a.pt").write_bytes(b"a")
    (job["dir"] / "a.pt.json").write_text("[" * 500_000)
    data = b"weights"
    (job["dir"] / "step-000000002.pt").write_bytes(data)
    record = {
        "attempt": 1,
        "step": 2,
        "path": "step-000000002.pt",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "kind": "file",
    }
    (job["dir"] / "step-000000002.pt.json").write_text(json.dumps(record))
    added = services(api).checkpoints.register_unlisted(job["id"], 1)
    assert [c.path for c in added] == ["step-000000002.pt"]


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_a_shared_checkpoint_directory_is_anchored_at_its_base(tmp_path: Path, scheme: str) -> None:
    """With --checkpoint-url a directory, every job's checkpoints lie in ``<url>/<id>``: a job
    that replaces its own directory by a link to another job's reads nothing of it."""
    base = tmp_path / "shared"
    with app_client(tmp_path, checkpoint_url=f"{scheme}{base}") as api:
        job, other = new_job(api, tmp_path), new_job(api, tmp_path)
        assert job["dir"] == base / str(job["id"])
        secret = other["dir"] / "step-000000001.pt"
        secret.write_bytes(b"another user's weights")
        job["dir"].rmdir()
        job["dir"].symlink_to(other["dir"])
        refused(register(api, job, secret.name, secret.stat().st_size), "symbolic link")
