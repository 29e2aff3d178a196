"""The server's side of checkpoints: registration, retention that never deletes what a restart
needs, corrupt reports, and verified downloads (in process, through the real app)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import BASE_URL, submit, wait_state, workdir
from trainhouse.client import Client
from trainhouse.core.tokens import hash_token
from trainhouse.errors import CheckpointError, ClientError
from trainhouse.ingest import checkpoints as checkpoints_module
from trainhouse.jobfs.storage import Storage, new_hash, tree_digest
from trainhouse.sdk._metrics import as_columns

AUTH = {"Authorization": "Bearer known"}


@pytest.fixture
def job(api: TestClient, tmp_path: Path) -> Iterator[dict[str, Any]]:
    spec = "entrypoint: python train.py\ncheckpoints: {keep_last: 2}\n"
    created = submit(api, spec, workdir(tmp_path)).json()
    wait_state(api, created["id"], {"COMPLETED"})
    services = api.app.state.runtime  # type: ignore[attr-defined]
    services.store.jobs.update(created["id"], token_hash=hash_token("known"))
    url = f"/api/v1/jobs/{created['id']}"
    directory = Path(api.get(f"{url}/checkpoints").json()["directory"])
    yield {"id": created["id"], "url": url, "dir": directory, "services": services}


def put(
    api: TestClient, job: dict[str, Any], step: int, data: bytes, drain: bool = True, **kw: Any
) -> Any:
    name = f"step-{step:09d}.pt"
    (job["dir"] / name).write_bytes(data)
    (job["dir"] / f"{name}.json").write_text("{}")
    body = {
        "attempt": 1,
        "step": step,
        "path": name,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        **kw,
    }
    resp = api.post(f"{job['url']}/checkpoints", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.json()
    if drain:
        job["services"].checkpoints.drain()
    return resp.json()


def listed(api: TestClient, job: dict[str, Any], **params: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = api.get(f"{job['url']}/checkpoints", params=params).json()[
        "checkpoints"
    ]
    return result


def test_retention_keeps_the_newest_and_deletes_files(
    api: TestClient,
    job: dict[str, Any],
) -> None:
    for step in range(1, 5):
        put(api, job, step, f"state {step}".encode())
    assert [c["step"] for c in listed(api, job)] == [3, 4]
    assert sorted(p.name for p in job["dir"].iterdir()) == [
        "step-000000003.pt",
        "step-000000003.pt.json",
        "step-000000004.pt",
        "step-000000004.pt.json",
    ]
    assert [c["deleted"] for c in listed(api, job, all="true")] == [True, True, False, False]


def test_fast_checkpoints_are_retired_in_batches_and_an_ended_attempt_at_once(
    api: TestClient, job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that checkpoints faster than ``RETENTION_EVERY`` has its retention run once per
    batch (one read-back of the newest for all it drops, not one per checkpoint); the end of
    its attempt runs it at once."""
    service = job["services"].checkpoints
    monkeypatch.setattr(checkpoints_module, "RETENTION_EVERY", 3600.0)
    read_backs: list[str] = []
    digest = Storage.digest

    def counted(self: Storage, name: str, **kw: Any) -> str:
        read_backs.append(name)
        return digest(self, name, **kw)

    monkeypatch.setattr(Storage, "digest", counted)
    put(api, job, 1, b"state 1")  # the first in a while: retention ran at once (nothing to drop)
    for step in range(2, 6):
        put(api, job, step, f"state {step}".encode(), drain=False)
    assert [c["step"] for c in listed(api, job)] == [1, 2, 3, 4, 5]  # its turn has not come
    assert read_backs == []
    service.attempt_ended(job["id"], 1)
    service.drain()
    assert [c["step"] for c in listed(api, job)] == [4, 5]
    assert read_backs == ["step-000000005.pt"]  # once, for the three dropped together
    assert sorted(p.name for p in job["dir"].iterdir()) == [
        "step-000000004.pt",
        "step-000000004.pt.json",
        "step-000000005.pt",
        "step-000000005.pt.json",
    ]


def test_a_step_written_again_replaces_its_record(api: TestClient, job: dict[str, Any]) -> None:
    put(api, job, 1, b"first try")
    again = put(api, job, 1, b"second try")  # the same step, after a restart
    assert [(c["id"], c["size"]) for c in listed(api, job)] == [(again["id"], 10)]
    assert [c["deleted"] for c in listed(api, job, all="true")] == [True, False]


def test_a_registration_stores_the_points_it_carries_first(
    api: TestClient, job: dict[str, Any]
) -> None:
    """The SDK sends the points logged before a checkpoint with its registration: stored
    first, answered as a report; a registration whose points or credential are refused is not
    made."""
    name = "step-000000002.pt"
    (job["dir"] / name).write_bytes(b"two")
    points = [(s, "loss", 1.0 / (s + 1), None, 0.0) for s in range(3)]
    report = {"batch_id": "b-1", "attempt": 1, "columns": as_columns(points)}
    body = {"attempt": 1, "step": 2, "path": name, "size": 3, "sha256": "0" * 64}
    url = f"{job['url']}/checkpoints"
    wrong = {"Authorization": "Bearer guess"}
    assert api.post(url, json={**body, "report": report}, headers=wrong).status_code == 401
    broken = {**report, "columns": {"step": [0], "name": []}}
    refused = api.post(url, json={**body, "report": broken}, headers=AUTH)
    assert refused.status_code == 422, refused.json()
    deep: dict[str, Any] = {}
    for _ in range(400):  # JSON the route reads, nested deeper than orjson writes
        deep = {"x": deep}
    too_deep = api.post(url, json={**body, "report": deep}, headers=AUTH)
    assert too_deep.status_code == 422, too_deep.text
    assert listed(api, job) == []
    resp = api.post(url, json={**body, "report": report}, headers=AUTH)
    assert resp.status_code == 201, resp.json()
    assert resp.json()["report"] == {"accepted": 3, "stop": False, "stop_reason": None}
    series = api.get(f"{job['url']}/metrics").json()["series"]
    assert [p[0] for p in series[0]["points"]] == [0, 1, 2]
    assert [c["step"] for c in listed(api, job)] == [2]
    plain = api.post(url, json={**body, "step": 3}, headers=AUTH).json()
    assert plain["report"] is None  # none carried, none answered


def test_a_corrupt_newest_checkpoint_stops_retention(
    api: TestClient,
    job: dict[str, Any],
) -> None:
    """Retention reads back the checkpoint a restart would load before deleting older ones."""
    for step in (1, 2):
        put(api, job, step, f"state {step}".encode())
    name = "step-000000003.pt"
    (job["dir"] / name).write_bytes(b"rotten")
    body = {"attempt": 1, "step": 3, "path": name, "size": 6, "sha256": "0" * 64}
    assert api.post(f"{job['url']}/checkpoints", json=body, headers=AUTH).status_code == 201
    job["services"].checkpoints.drain()
    assert [c["step"] for c in listed(api, job)] == [1, 2]  # both kept, 3 is not offered
    bad = listed(api, job, all="true")[-1]
    assert bad["step"] == 3 and "does not match" in bad["corrupt"]
    assert (job["dir"] / "step-000000001.pt").is_file()
    events = api.get(job["url"]).json()["events"]
    assert "checkpoint of step 3 is corrupt" in events[-1]["reason"]


def test_the_sdk_reports_a_corrupt_checkpoint(
    api: TestClient,
    job: dict[str, Any],
) -> None:
    first = put(api, job, 1, b"one")
    put(api, job, 2, b"two")
    url = f"{job['url']}/checkpoints/{first['id']}/corrupt"
    assert api.post(url, json={"reason": "x"}).status_code == 401  # the job's credential only
    resp = api.post(url, json={"reason": "sha256 mismatch on load"}, headers=AUTH)
    assert resp.status_code == 200 and resp.json()["corrupt"] == "sha256 mismatch on load"
    assert [c["step"] for c in listed(api, job)] == [2]
    missing = f"{job['url']}/checkpoints/999/corrupt"
    assert api.post(missing, json={"reason": "x"}, headers=AUTH).status_code == 404


def test_registration_checks_what_is_in_storage(
    api: TestClient,
    job: dict[str, Any],
) -> None:
    (job["dir"] / "a.pt").write_bytes(b"abc")
    cases = [
        ({"path": "missing.pt", "size": 3}, "does not exist"),
        ({"path": "a.pt", "size": 4}, "3 bytes in storage, but 4"),
        ({"path": "a.pt", "size": 3, "kind": "sharded"}, "is a file, but was reported"),
        ({"path": "../../a.pt", "size": 3}, "'..'"),
        ({"path": "/etc/passwd", "size": 3}, "relative"),
    ]
    for fields, message in cases:
        body = {"attempt": 1, "step": 1, "sha256": "0" * 64, **fields}
        resp = api.post(f"{job['url']}/checkpoints", json=body, headers=AUTH)
        assert resp.status_code == 422, (fields, resp.json())
        assert message in resp.json()["error"]["message"], resp.json()


def client_for(api: TestClient) -> Client:
    client = Client(BASE_URL)
    client._http = api
    api.base_url = f"{BASE_URL}/api/v1"  # type: ignore[assignment]
    return client


def test_download_verifies_file_and_sharded_checkpoints(
    api: TestClient,
    job: dict[str, Any],
    tmp_path: Path,
) -> None:
    put(api, job, 1, b"weights" * 1000)
    shard_dir = job["dir"] / "step-000000002"
    (shard_dir / "sub").mkdir(parents=True)
    files = {"__0_0.distcp": b"rank zero", "sub/.metadata": b"meta", "__1_0.distcp": b"rank one"}
    for rel, data in files.items():
        (shard_dir / rel).write_bytes(data)
    digest = tree_digest(
        (rel, hashlib.sha256(data).hexdigest(), len(data)) for rel, data in files.items()
    )
    body = {
        "attempt": 1,
        "step": 2,
        "path": "step-000000002",
        "size": sum(len(d) for d in files.values()),
        "sha256": digest,
        "kind": "sharded",
    }
    assert api.post(f"{job['url']}/checkpoints", json=body, headers=AUTH).status_code == 201

    client = client_for(api)
    seen: list[tuple[int, int]] = []
    got = client.download_checkpoint(
        job["id"], 1, tmp_path / "out", progress=lambda d, t: seen.append((d, t))
    )
    assert got == tmp_path / "out" / "step-000000001.pt"
    assert got.read_bytes() == b"weights" * 1000 and seen[-1] == (7000, 7000)
    got = client.download_checkpoint(job["id"], None, tmp_path / "out")
    assert got.is_dir() and {
        p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file()
    } == set(files)
    assert (got / "sub" / ".metadata").read_bytes() == b"meta"

    (shard_dir / "__1_0.distcp").write_bytes(b"rank 0ne")  # rots on the server's disk
    with pytest.raises(CheckpointError, match="corrupt"):
        client.download_checkpoint(job["id"], 2, tmp_path / "again")
    assert not (tmp_path / "again" / "step-000000002").exists()
    assert list((tmp_path / "again").iterdir()) == []  # no partial download left
    with pytest.raises(ClientError, match="no checkpoint of step 7"):
        client.download_checkpoint(job["id"], 7, tmp_path / "out")


def test_checkpoints_left_unregistered_are_registered_at_the_attempts_end(
    api: TestClient,
    job: dict[str, Any],
) -> None:
    """The server was down as the run ended: the SDK's records next to the files remain."""
    put(api, job, 1, b"one")
    for step, data, size in ((2, b"two", 3), (3, b"three", 99)):  # 3's record is wrong
        name = f"step-{step:09d}.pt"
        (job["dir"] / name).write_bytes(data)
        record = {
            "attempt": 1,
            "step": step,
            "path": name,
            "size": size,
            "sha256": hashlib.sha256(data).hexdigest(),
            "metrics": {"val_loss": 0.5},
            "kind": "file",
        }
        (job["dir"] / f"{name}.json").write_text(json.dumps(record))
    (job["dir"] / ".step-000000004.pt.tmp-123-abcdef01").write_bytes(b"half")
    added = job["services"].checkpoints.register_unlisted(job["id"], 1)
    assert [c.step for c in added] == [2]
    assert [c["step"] for c in listed(api, job)] == [1, 2]
    assert listed(api, job)[-1]["metrics"] == {"val_loss": 0.5}
    assert job["services"].checkpoints.register_unlisted(job["id"], 1) == []  # once


def blake3_hex(data: bytes) -> str:
    hasher = new_hash("blake3")
    hasher.update(data)
    return str(hasher.hexdigest())


def test_blake3_checkpoints_are_registered_verified_and_downloaded(
    api: TestClient,
    job: dict[str, Any],
    tmp_path: Path,
) -> None:
    """The record names its digest's algorithm: retention and downloads verify with it; a
    record without one is sha256 (every checkpoint registered before blake3)."""
    put(api, job, 1, b"one")  # sha256, no algorithm named
    for step in (2, 3):
        data = f"state {step}".encode()
        put(api, job, step, data, sha256=blake3_hex(data), algorithm="blake3")
    kept = listed(api, job)
    assert [(c["step"], c["algorithm"], c["corrupt"]) for c in kept] == [
        (2, "blake3", None),
        (3, "blake3", None),
    ]  # the newest verified with blake3, step 1 deleted
    assert listed(api, job, all="true")[0]["algorithm"] == "sha256"

    # a sha256 digest registered as blake3 does not verify: retention keeps the older ones
    data = b"state 4"
    put(api, job, 4, data, sha256=hashlib.sha256(data).hexdigest(), algorithm="blake3")
    bad = listed(api, job, all="true")[-1]
    assert bad["step"] == 4 and "blake3" in bad["corrupt"] and "does not match" in bad["corrupt"]
    assert [c["step"] for c in listed(api, job)] == [2, 3]
    body = {"attempt": 1, "step": 5, "path": "step-000000003.pt", "size": 7, "sha256": "0" * 64}
    resp = api.post(f"{job['url']}/checkpoints", json={**body, "algorithm": "md5"}, headers=AUTH)
    assert resp.status_code == 422
    got = client_for(api).download_checkpoint(job["id"], 3, tmp_path / "out")
    assert got.read_bytes() == b"state 3"
    (job["dir"] / "step-000000003.pt").write_bytes(b"state 8")  # rots on the server's disk
    with pytest.raises(CheckpointError, match="corrupt"):
        client_for(api).download_checkpoint(job["id"], 3, tmp_path / "again")


def test_unregistered_blake3_records_keep_their_algorithm(
    api: TestClient,
    job: dict[str, Any],
) -> None:
    for step, algorithm in ((2, "blake3"), (3, "crc32")):  # 3 names no known algorithm
        name = f"step-{step:09d}.pt"
        data = f"state {step}".encode()
        (job["dir"] / name).write_bytes(data)
        record = {
            "attempt": 1,
            "step": step,
            "path": name,
            "size": len(data),
            "sha256": blake3_hex(data),
            "algorithm": algorithm,
            "kind": "file",
        }
        (job["dir"] / f"{name}.json").write_text(json.dumps(record))
    added = job["services"].checkpoints.register_unlisted(job["id"], 1)
    assert [(c.step, c.algorithm) for c in added] == [(2, "blake3")]
