from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from trainhouse.errors import ArchiveError
from trainhouse.workdir import extract, iter_files, list_members, pack


def make_tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "model.py").write_text("x = 1\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (root / "notes.log").write_text("log\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / ".trainhouseignore").write_text("data/\n")


def test_pack_honours_ignore_files(tmp_path: Path) -> None:
    make_tree(tmp_path)
    names = sorted(rel for _, rel in iter_files(tmp_path))
    assert names == [".gitignore", ".trainhouseignore", "pkg/model.py", "train.py"]


def test_pack_extract_roundtrip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src)
    packed = pack(src)
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(packed.data)
    assert "train.py" in list_members(archive)
    out = tmp_path / "out"
    extract(archive, out)
    assert (out / "pkg" / "model.py").read_text() == "x = 1\n"
    assert not (out / "data").exists()


def test_pack_refuses_oversize_naming_largest_files(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x\n")
    (tmp_path / "weights.bin").write_bytes(os.urandom(300_000))
    with pytest.raises(ArchiveError) as err:
        pack(tmp_path, limit=100_000)
    msg = str(err.value)
    assert "weights.bin (293.0 KiB)" in msg and "largest files" in msg
    assert ".trainhouseignore" in msg


def _tar(tmp_path: Path, build: object) -> Path:
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        build(tar)  # type: ignore[operator]
    return path


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"x", **kw: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in kw.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data) if info.isfile() else None)


@pytest.mark.parametrize(
    ("name", "kw", "message"),
    [
        ("../evil.py", {}, "outside the workdir"),
        ("/etc/passwd", {}, "absolute path"),
        ("link", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}, "is a link"),
        ("hard", {"type": tarfile.LNKTYPE, "linkname": "train.py"}, "is a link"),
        ("dev", {"type": tarfile.CHRTYPE}, "not a regular file"),
    ],
)
def test_unsafe_archives_refused(tmp_path: Path, name: str, kw: dict, message: str) -> None:
    archive = _tar(tmp_path, lambda t: _add(t, name, **kw))
    with pytest.raises(ArchiveError, match=message):
        list_members(archive)
    with pytest.raises(ArchiveError):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "evil.py").exists()


def test_not_an_archive(tmp_path: Path) -> None:
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"this is not gzip")
    with pytest.raises(ArchiveError, match=r"not a valid \.tar\.gz"):
        list_members(bad)


def test_pack_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="not a directory"):
        pack(tmp_path / "missing")
