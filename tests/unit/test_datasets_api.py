"""Datasets over the REST API and the client, the real app in process: versions added from an
uploaded directory and from a file:// source, numbers never reused, identical content giving
its version, jobs pinning a version at submit (and a bare name the newest), removal refused
while a job pins it, who may read and change what, and hostile uploads."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import (
    BASE_URL,
    CROSS_SITE,
    InProcessTransport,
    app_client,
    cross_origin,
    error_of,
    page_request,
    services,
    submit,
    wait_launched,
    wait_state,
    workdir,
)
from tests.support.team import make_team, refused
from trainhouse.client.datasets import pack_dataset
from trainhouse.core.tokens import hash_token, job_token
from trainhouse.core.wire import CLIENT_HEADERS


def _upload(api: TestClient, name: str, directory: Path, tmp_path: Path) -> Any:
    packed = tmp_path / f"{name}-{directory.name}.tar.gz"
    pack_dataset(directory, packed)
    return api.post(
        f"/api/v1/datasets/{name}/upload",
        files={"archive": ("d.tar.gz", packed.read_bytes(), "application/gzip")},
    )


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def test_versions_from_an_upload_are_numbered_kept_and_read_back(
    api: TestClient, tmp_path: Path
) -> None:
    one = _tree(tmp_path / "v1", {"train/a.bin": b"a" * 1000, "labels.csv": b"x,y\n1,2\n"})
    first = _upload(api, "digits", one, tmp_path)
    assert first.status_code == 201, first.text
    v1 = first.json()["version"]
    assert first.json()["new"] is True
    assert (v1["version"], v1["files"], v1["size"], v1["source"]) == (1, 2, 1008, None)
    assert v1["checksums"] == "sha256"

    # the same content again is the same version; other content is the next number
    again = _upload(api, "digits", one, tmp_path)
    assert again.status_code == 201 and again.json() == {"version": v1, "new": False}
    two = _tree(tmp_path / "v2", {"train/a.bin": b"a" * 1000, "labels.csv": b"x,y\n9,9\n"})
    v2 = _upload(api, "digits", two, tmp_path).json()["version"]
    assert v2["version"] == 2 and v2["digest"] != v1["digest"]

    listed = api.get("/api/v1/datasets").json()["datasets"]
    assert [(d["name"], d["versions"], d["latest"]) for d in listed] == [("digits", 2, 2)]
    manifest = api.get("/api/v1/datasets/digits/versions/1/manifest").json()
    assert manifest["digest"] == v1["digest"]
    by_path = {f["path"]: f for f in manifest["files"]}
    assert by_path["labels.csv"]["digest"] == hashlib.sha256(b"x,y\n1,2\n").hexdigest()
    got = api.get("/api/v1/datasets/digits/versions/1/files/train/a.bin")
    assert got.status_code == 200 and got.content == b"a" * 1000

    # a removed number is never given again; the bytes v2 shares stay readable
    assert api.delete("/api/v1/datasets/digits/versions/2").status_code == 200
    three = _tree(tmp_path / "v3", {"c.txt": b"c"})
    assert _upload(api, "digits", three, tmp_path).json()["version"]["version"] == 3
    assert api.get("/api/v1/datasets/digits/versions/1/files/train/a.bin").content == b"a" * 1000
    missing = api.get("/api/v1/datasets/digits/versions/2")
    assert missing.status_code == 404 and "no version 2" in error_of(missing)["message"]


def test_a_job_pins_a_version_at_submit_and_removal_waits_for_it(
    tmp_path: Path,
) -> None:
    with app_client(tmp_path, exit_code=None) as api:  # jobs run until they are stopped
        data = _tree(tmp_path / "d", {"x.txt": b"one"})
        _upload(api, "mnist", data, tmp_path)
        spec = "name: reads\nentrypoint: python train.py\ndatasets:\n  train: mnist\n"
        job = submit(api, spec, workdir(tmp_path)).json()
        # a bare name is the newest version now, kept in the job's spec
        assert job["spec"]["datasets"] == {"train": "mnist@1"}
        shown = api.get(f"/api/v1/jobs/{job['id']}").json()
        assert [(p["key"], p["ref"]) for p in shown["datasets"]] == [("train", "mnist@1")]
        _upload(api, "mnist", _tree(tmp_path / "d2", {"x.txt": b"two"}), tmp_path)

        refused = api.delete("/api/v1/datasets/mnist/versions/1")
        assert refused.status_code == 409
        assert f"pinned by job {job['id']}" in error_of(refused)["message"]
        users = api.get("/api/v1/datasets/mnist/versions/1").json()["jobs"]
        assert users == [job["id"]]

        # while it stages, the job list says where staging stands (ps shows it)
        wait_launched(api, job["id"])
        files = services(api).files(job["id"])
        files.logs.mkdir(parents=True, exist_ok=True)
        files.log("launcher").write_text(
            "=== trainhouse: attempt 1 ===\ntrainhouse: staging mnist@1: 1 files, 0.0 MB\n"
            "trainhouse: staging mnist@1: 41% (0.0 MB of 0.0 MB)\n"
        )
        listed = {j["id"]: j for j in api.get("/api/v1/jobs").json()["jobs"]}
        assert listed[job["id"]]["reason"] == "staging mnist@1: 41% (0.0 MB of 0.0 MB)"

        api.post(f"/api/v1/jobs/{job['id']}/cancel")
        services(api).scheduler.executor.end(job["id"], -15)  # type: ignore[attr-defined]
        wait_state(api, job["id"], {"CANCELED"})
        assert api.delete("/api/v1/datasets/mnist/versions/1").status_code == 200
        # the job keeps what it read: a model stays traced to the bytes
        shown = api.get(f"/api/v1/jobs/{job['id']}").json()
        assert [p["ref"] for p in shown["datasets"]] == ["mnist@1"]

        bad = submit(api, spec.replace("mnist", "nothing"), workdir(tmp_path))
        assert bad.status_code == 404
        assert "datasets.train: no dataset named 'nothing'" in error_of(bad)["message"]
        bad = submit(api, spec.replace("train: mnist", "Train: mnist"), workdir(tmp_path))
        assert bad.status_code == 422 and "datasets key 'Train'" in error_of(bad)["message"]


def test_who_may_read_and_change_datasets(tmp_path: Path) -> None:
    for team in make_team(tmp_path):
        packed = tmp_path / "f.tar.gz"
        pack_dataset(_tree(tmp_path / "a", {"f": b"a"}), packed)
        upload = {"files": {"archive": ("d.tar.gz", packed.read_bytes(), "application/gzip")}}
        assert team.post("alice", "/datasets/a/upload", **upload).status_code == 201
        assert team.post("alice", "/datasets/b/upload", **upload).status_code == 201
        assert "viewers can read" in refused(team.post("vera", "/datasets/c/upload", **upload))
        assert team.get("vera", "/datasets/a/versions/1/manifest").status_code == 200
        # bob may not add to or remove alice's dataset; an admin may
        assert "belongs to alice" in refused(team.post("bob", "/datasets/a/upload", **upload))
        gone = team.api.delete("/api/v1/datasets/b/versions/1", headers=team.h("bob"))
        assert "belongs to alice" in refused(gone)
        gone = team.api.delete("/api/v1/datasets/b/versions/1", headers=team.h("root"))
        assert gone.status_code == 200

        # a job's credential reads the versions its job pins, nothing else
        job = team.submit("alice", "reads", "datasets: {x: a@1}\n").json()
        assert team.submit("alice", "x", "datasets: {x: b}\n").status_code == 404
        secret = job_token(job["id"])
        team.rt.store.jobs.update(job["id"], token_hash=hash_token(secret))
        headers = {"Authorization": f"Bearer {secret}"}
        api = team.api
        manifest = api.get("/api/v1/datasets/a/versions/1/manifest", headers=headers)
        assert manifest.status_code == 200
        assert api.get("/api/v1/datasets/a/versions/1/files/f", headers=headers).content == b"a"
        assert team.post("alice", "/datasets/b/upload", **upload).status_code == 201
        other = api.get("/api/v1/datasets/b/versions/2/files/f", headers=headers)
        assert "does not pin b@2" in refused(other)
        refused(api.get("/api/v1/datasets", headers=headers))


def test_a_file_source_outside_the_roots_is_refused_and_inside_is_listed(tmp_path: Path) -> None:
    shared = _tree(tmp_path / "shared" / "set", {"p/q.txt": b"q", "r.txt": b"r"})
    with app_client(tmp_path, dataset_file_roots=(tmp_path / "shared",)) as api:
        made = api.post("/api/v1/datasets/s/versions", json={"source": f"file://{shared}"})
        assert made.status_code == 201, made.text
        v = made.json()["version"]
        assert (v["files"], v["source"]) == (2, f"file://{shared}")
        outside = api.post("/api/v1/datasets/s/versions", json={"source": "file:///etc"})
        assert outside.status_code == 422, outside.text
        secret = api.post(
            "/api/v1/datasets/s/versions",
            json={"source": f"file://{shared}", "storage_options": {"secret": "x"}},
        )
        assert secret.status_code == 422
        # a file the server does not hold is read by the nodes, not served
        served = api.get("/api/v1/datasets/s/versions/1/files/r.txt")
        assert served.status_code == 422 and "not from the server" in error_of(served)["message"]
        # --copy keeps the files in the server's storage: read from there from then on
        copied = api.post(
            "/api/v1/datasets/kept/versions", json={"source": f"file://{shared}", "copy": True}
        )
        assert copied.status_code == 201, copied.text
        kept = copied.json()["version"]
        assert kept["source"] is None and kept["digest"] == v["digest"]
        (shared / "r.txt").write_bytes(b"changed at the source")
        assert api.get("/api/v1/datasets/kept/versions/1/files/r.txt").content == b"r"


def _tar(members: list[tarfile.TarInfo], data: bytes = b"") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(data) if m.isfile() else None)
    return buf.getvalue()


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo("../escape.txt"),
        tarfile.TarInfo("/abs.txt"),
        tarfile.TarInfo("dir/link"),
        tarfile.TarInfo("dev"),
    ],
    ids=["dotdot", "absolute", "symlink", "device"],
)
def test_hostile_uploads_are_refused_and_write_nothing(
    api: TestClient, tmp_path: Path, member: tarfile.TarInfo
) -> None:
    if member.name == "dir/link":
        member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif member.name == "dev":
        member.type, member.devmajor, member.devminor = tarfile.CHRTYPE, 1, 3
    else:
        member.size = 1
    resp = api.post(
        "/api/v1/datasets/evil/upload",
        files={"archive": ("d.tar.gz", _tar([member], b"x"), "application/gzip")},
    )
    assert resp.status_code == 422, resp.text
    assert api.get("/api/v1/datasets").json()["datasets"] == []
    assert (
        not (tmp_path / "escape.txt").exists() and not (tmp_path / "home" / "escape.txt").exists()
    )
    leftover = services(api).settings.datasets_home / "tmp"
    assert not leftover.exists() or list(leftover.iterdir()) == []


def test_the_client_packs_a_directory_and_refuses_a_link_in_it(
    api: TestClient, tmp_path: Path
) -> None:
    import httpx

    from trainhouse.client import Client
    from trainhouse.core.errors import ClientError

    data = _tree(tmp_path / "data", {"a.txt": b"a", "sub/b.txt": b"bb"})
    c = Client(BASE_URL)
    c._http.close()
    c._http = httpx.Client(
        base_url=f"{BASE_URL}/api/v1", headers=CLIENT_HEADERS, transport=InProcessTransport(api)
    )
    with c:
        added = c.add_dataset("local", data, description="two files")
        assert added["new"] and added["version"]["files"] == 2
        assert added["version"]["description"] == "two files"
        assert [d["name"] for d in c.datasets()] == ["local"]
        assert c.dataset_version("local")["version"] == 1
        (data / "link").symlink_to("/etc/passwd")
        with pytest.raises(ClientError, match="symbolic link"):
            c.add_dataset("local", data)


def test_a_page_of_another_site_adds_and_removes_no_dataset(
    api: TestClient, tmp_path: Path
) -> None:
    assert _upload(api, "kept", _tree(tmp_path / "k", {"f": b"k"}), tmp_path).status_code == 201
    packed = tmp_path / "evil.tar.gz"
    pack_dataset(_tree(tmp_path / "e", {"f": b"e"}), packed)
    files = {"archive": ("d.tar.gz", packed.read_bytes(), "application/gzip")}
    cross_origin(
        page_request(api, "POST", "/api/v1/datasets/evil/upload", files=files, headers=CROSS_SITE)
    )
    cross_origin(
        page_request(
            api,
            "POST",
            "/api/v1/datasets/evil/versions",
            json={"source": "file:///etc"},
            headers=CROSS_SITE,
        )
    )
    cross_origin(
        page_request(api, "DELETE", "/api/v1/datasets/kept/versions/1", headers=CROSS_SITE)
    )
    assert [d["name"] for d in api.get("/api/v1/datasets").json()["datasets"]] == ["kept"]
    assert api.get("/api/v1/datasets/kept/versions/1").status_code == 200
