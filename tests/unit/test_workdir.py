from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.archives import (
    CRAFTED,
    DIR,
    SMALL,
    Crafted,
    add_member,
    many_members,
    pax_record,
    tar_of,
    zeros_member,
)
from trainhouse.errors import ArchiveError
from trainhouse.jobfs import workdir
from trainhouse.jobfs.workdir import ArchiveLimits, extract, iter_files, list_members, pack


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
    archive = tar_of(tmp_path, lambda t: add_member(t, name, **kw))
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


# Crafted uploads (tests/support/archives.py): list_members and extract refuse each.


def _case_dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(archive, extraction target, sentinel): target and sentinel are siblings."""
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    return tmp_path / "upload.tar.gz", tmp_path / "target", sentinel


def _nothing_escaped(tmp_path: Path, sentinel: Path) -> None:
    assert sorted(os.listdir(tmp_path)) == ["sentinel", "upload.tar.gz"]  # target removed
    assert list(sentinel.iterdir()) == []
    assert not Path("/tmp/evil.py").exists()


@pytest.mark.parametrize("case", CRAFTED, ids=[c.id for c in CRAFTED])
def test_crafted_archive_is_refused(tmp_path: Path, case: Crafted) -> None:
    archive, target, sentinel = _case_dirs(tmp_path)
    case.build(archive, sentinel)
    with pytest.raises(ArchiveError, match=case.message):
        list_members(archive, case.limits)
    with pytest.raises(ArchiveError, match=case.message):
        extract(archive, target, case.limits)
    _nothing_escaped(tmp_path, sentinel)


@pytest.mark.parametrize("case", CRAFTED, ids=[c.id for c in CRAFTED])
def test_crafted_archive_errors_are_readable(tmp_path: Path, case: Crafted) -> None:
    """Every message is short, printable ASCII (names with control bytes are escaped)."""
    archive, _target, sentinel = _case_dirs(tmp_path)
    case.build(archive, sentinel)
    with pytest.raises(ArchiveError) as err:
        list_members(archive, case.limits)
    message = str(err.value)
    assert message.isprintable() and message.isascii(), message
    assert len(message) < 400, message


def test_crafted_archives_pass_with_the_offending_member_left_out(tmp_path: Path) -> None:
    """The cases fail because of what they add: train.py alone is a fine archive."""
    archive, target, _sentinel = _case_dirs(tmp_path)
    Crafted("plain", lambda tar, s: None, "").build(archive, tmp_path)
    assert list_members(archive, SMALL) == ["train.py"]
    extract(archive, target, SMALL)
    assert (target / "train.py").read_bytes() == b"print('hi')\n"


def test_limits_are_read_when_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's routes call list_members() without limits: DEFAULT_LIMITS applies."""
    archive, _target, sentinel = _case_dirs(tmp_path)
    Crafted("many", many_members(30), "").build(archive, sentinel)
    assert len(list_members(archive)) == 31
    monkeypatch.setattr(workdir, "DEFAULT_LIMITS", SMALL)
    with pytest.raises(ArchiveError, match="more than 20 members"):
        list_members(archive)


def test_gzip_bomb_stops_reading_at_the_cap(tmp_path: Path) -> None:
    """A 50 MiB run of zeros in a ~50 KiB upload: refused after reading about the ratio's
    worth, not after inflating everything."""
    archive, target, sentinel = _case_dirs(tmp_path)
    with tarfile.open(archive, "w:gz", compresslevel=9) as tar:
        zeros_member(tar, "zeros.bin", 50 << 20)
    compressed = archive.stat().st_size
    assert compressed < 200_000
    limits = ArchiveLimits(ratio=100, ratio_floor=1 << 20)
    reads: list[int] = []
    original = workdir._Inflating.read

    def counting(self: Any, size: int = -1) -> bytes:
        data: bytes = original(self, size)
        reads.append(len(data))
        return data

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(workdir._Inflating, "read", counting)
        with pytest.raises(ArchiveError, match="inflates more than 100 times"):
            extract(archive, target, limits)
    assert sum(reads) <= max(limits.ratio_floor, 100 * compressed) + (1 << 20)
    _nothing_escaped(tmp_path, sentinel)


def test_truncated_and_corrupt_uploads(tmp_path: Path) -> None:
    good = tmp_path / "good.tar.gz"
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_bytes(os.urandom(20_000))
    good.write_bytes(pack(src).data)
    data = good.read_bytes()
    for i, bad in enumerate([data[: len(data) // 2], data[:10] + b"\xff" * 64 + data[74:]]):
        path = tmp_path / f"bad{i}.tar.gz"
        path.write_bytes(bad)
        with pytest.raises(ArchiveError, match=r"not a valid \.tar\.gz archive"):
            list_members(path)
        with pytest.raises(ArchiveError):
            extract(path, tmp_path / f"out{i}")
        assert not (tmp_path / f"out{i}").exists()


def test_confinement_holds_even_with_a_link_planted_in_the_target(tmp_path: Path) -> None:
    """Defence in depth below the member checks: a link already in the target (a race, a
    bug) can neither be walked through nor resolve outside."""
    root = tmp_path / "target"
    root.mkdir()
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (root / "pkg").symlink_to(sentinel)
    with pytest.raises(ArchiveError, match="needs 'pkg' to be a directory"):
        workdir._directory(root, ("pkg", "sub"), "pkg/sub/evil.py")
    with pytest.raises(ArchiveError, match="would be written outside the workdir"):
        workdir._confined(root, root / "pkg" / "evil.py", "pkg/evil.py")
    workdir._confined(root, root / "ok" / "fine.py", "ok/fine.py")  # inside: accepted
    assert list(sentinel.iterdir()) == []


def test_accepted_archives_unpack_safely(tmp_path: Path) -> None:
    """What real packers write is accepted: a './' root entry, './' prefixes, directories,
    PAX long names, a git-archive style global header; modes lose setuid and group/other
    write."""
    archive, target, _sentinel = _case_dirs(tmp_path)
    long_name = "pkg/" + "n" * 150 + ".py"
    with tarfile.open(archive, "w:gz", pax_headers={"comment": "0123abcd"}) as tar:
        add_member(tar, "./", **DIR)
        add_member(tar, "./pkg/", **DIR)
        add_member(tar, "./train.py", b"run\n", mode=0o4777)
        add_member(tar, long_name, b"long\n")
        add_member(tar, "pkg/sub/deep.py", b"deep\n", mode=0o644)
    names = list_members(archive)
    assert sorted(names) == sorted(["train.py", long_name, "pkg/sub/deep.py"])
    extract(archive, target)
    assert (target / long_name).read_bytes() == b"long\n"
    assert (target / "pkg" / "sub" / "deep.py").read_bytes() == b"deep\n"
    assert stat.S_IMODE((target / "train.py").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "pkg/sub/deep.py").stat().st_mode) == 0o644


def test_extract_refuses_an_existing_target(tmp_path: Path) -> None:
    archive, target, sentinel = _case_dirs(tmp_path)
    Crafted("plain", lambda tar, s: None, "").build(archive, sentinel)
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        extract(archive, target)
    assert (target / "keep.txt").read_text() == "mine"  # not removed: not ours


def test_pax_records_parser() -> None:
    record = pax_record("path", "a/b.py") + pax_record("mtime", "1700000000.5")
    assert workdir._pax_records(record + b"\0" * 20, 0) == {
        "path": "a/b.py",
        "mtime": "1700000000.5",
    }
    for bad in (b"x path=a\n", b"99 path=a\n", b"9 patha\n\n", b"8 path=\xff\n", b"0 =\n"):
        with pytest.raises(ArchiveError, match="malformed PAX header at byte 7"):
            workdir._pax_records(bad, 7)
