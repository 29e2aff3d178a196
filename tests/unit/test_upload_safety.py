"""Crafted workdir uploads posted to the API: each is refused with a 4xx JSON error that names
the rule and the member, no job is created, and nothing lands outside the server's home.

The archives are tests/support/archives.py's, which tests/unit/test_workdir.py feeds to
list_members and extract.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.api import error_of, submit
from tests.support.archives import CRAFTED, Crafted, zeros_member
from trainhouse.jobfs import workdir

SPEC = "name: crafted\nentrypoint: python train.py\n"


def _refused(client: TestClient, tmp_path: Path, archive: bytes, message: str) -> dict[str, str]:
    """POST the archive; it must be refused (4xx JSON error), create no job, write nothing."""
    resp = submit(client, SPEC, archive)
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    err = error_of(resp)
    assert set(err) == {"code", "message"}
    assert err["code"] == "invalid_archive", err
    assert re.search(message, err["message"]), err["message"]
    assert client.get("/api/v1/jobs", params={"all": "true"}).json()["jobs"] == []
    escaped = [p for p in tmp_path.rglob("evil*") if p.is_file()]
    assert escaped == [], escaped
    assert stored_blobs(tmp_path) == []  # a refused upload is not kept (nor fills the disk)
    return err


def stored_blobs(tmp_path: Path) -> list[Path]:
    """Files in the server's blob store (its archives and their temp files)."""
    blobs = tmp_path / "home" / "blobs"
    return [p for p in blobs.rglob("*") if p.is_file()] if blobs.exists() else []


def test_an_upload_without_its_entrypoint_is_not_kept(
    api: TestClient,
    tmp_path: Path,
) -> None:
    src = tmp_path / "wd"
    src.mkdir()
    (src / "other.py").write_text("print(1)\n")
    resp = submit(api, SPEC, workdir.pack(src).data)
    assert resp.status_code == 422 and "entrypoint file 'train.py'" in error_of(resp)["message"]
    assert stored_blobs(tmp_path) == []


@pytest.mark.parametrize("case", CRAFTED, ids=[c.id for c in CRAFTED])
def test_crafted_upload_is_refused(
    api: TestClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: Crafted,
) -> None:
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    archive = case.build(tmp_path / "upload.tar.gz", sentinel)
    if case.limits is not None:  # the route validates with workdir.DEFAULT_LIMITS
        monkeypatch.setattr(workdir, "DEFAULT_LIMITS", case.limits)
    err = _refused(api, tmp_path, archive.read_bytes(), case.message)
    assert err["message"].isascii() and len(err["message"]) < 400
    assert list(sentinel.iterdir()) == []


def test_gzip_bomb_at_the_default_limits(
    api: TestClient,
    tmp_path: Path,
) -> None:
    """~70 KiB that inflates to 80 MiB of zeros: past the 64 MiB floor, over 200 times its
    size; refused without changing any limit."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
        train = tarfile.TarInfo("train.py")
        train.size = 3
        tar.addfile(train, io.BytesIO(b"x=1"))
        zeros_member(tar, "zeros.bin", 80 << 20)
    assert len(buf.getvalue()) < 200_000
    _refused(api, tmp_path, buf.getvalue(), "inflates more than 200 times its compressed size")


def test_not_an_archive(api: TestClient, tmp_path: Path) -> None:
    _refused(api, tmp_path, b"\x1f\x8b not really gzip", r"not a valid \.tar\.gz archive")
