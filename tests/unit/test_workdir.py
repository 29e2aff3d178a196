from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trainhouse import workdir
from trainhouse.errors import ArchiveError
from trainhouse.workdir import ArchiveLimits, extract, iter_files, list_members, pack


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


# ---------------------------------------------------------------------------------------------
# Crafted uploads. Each case builds a hostile .tar.gz; list_members and extract must refuse it
# with an ArchiveError that names the rule and the member, and nothing may appear outside the
# extraction target. tests/unit/test_upload_safety.py posts the same archives to the API.

SMALL = ArchiveLimits(
    members=20,
    extracted_bytes=64 * 1024,
    inflated_bytes=256 * 1024,
    ratio=20,
    ratio_floor=128 * 1024,
)


@dataclass(frozen=True)
class Crafted:
    id: str
    members: Callable[[tarfile.TarFile, Path], None]  # (tar, sentinel dir) adds the members
    message: str  # a regex the ArchiveError matches
    limits: ArchiveLimits | None = None  # None: the defaults
    format: int = tarfile.PAX_FORMAT
    global_pax: dict[str, str] | None = None

    def build(self, path: Path, sentinel: Path) -> Path:
        """Write the archive to ``path``: a benign ``train.py`` first, then the crafted part."""
        with tarfile.open(
            path, "w:gz", format=self.format, pax_headers=self.global_pax, compresslevel=9
        ) as tar:
            _add(tar, "train.py", b"print('hi')\n")
            self.members(tar, sentinel)
        return path


def _header(tar: tarfile.TarFile, kind: bytes, data: bytes) -> None:
    """A raw extended header (PAX 'x'/'g', GNU 'L') written as if it were a member."""
    info = tarfile.TarInfo(
        "././@PaxHeader" if kind != tarfile.GNUTYPE_LONGNAME else "././@LongLink"
    )
    info.type = kind
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, produced as read (a bomb is never held in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self.left)
        buf[:n] = bytes(n)
        self.left -= n
        return n


def _zeros(tar: tarfile.TarFile, name: str, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    tar.addfile(info, _Zeros(size))


def _pax_path(value: str) -> Callable[[tarfile.TarFile, Path], None]:
    """A member whose tar header says 'benign.py' and whose PAX record says ``value``."""

    def members(tar: tarfile.TarFile, _sentinel: Path) -> None:
        info = tarfile.TarInfo("benign.py")
        info.size = 4
        info.pax_headers = {"path": value}
        tar.addfile(info, io.BytesIO(b"evil"))

    return members


def _each(*adds: tuple[str, dict[str, Any]]) -> Callable[[tarfile.TarFile, Path], None]:
    def members(tar: tarfile.TarFile, _sentinel: Path) -> None:
        for name, kw in adds:
            _add(tar, name, **kw)

    return members


def _headed(
    kind: bytes, data: bytes, name: str = "x.py", times: int = 1
) -> Callable[[tarfile.TarFile, Path], None]:
    """``times`` raw extended headers of ``kind`` holding ``data``, then the member ``name``."""

    def members(tar: tarfile.TarFile, _sentinel: Path) -> None:
        for _ in range(times):
            _header(tar, kind, data)
        _add(tar, name)

    return members


def _many(count: int, data: bytes = b"x") -> Callable[[tarfile.TarFile, Path], None]:
    def members(tar: tarfile.TarFile, _sentinel: Path) -> None:
        for i in range(count):
            _add(tar, f"f{i}.py", data)

    return members


def _negative_size(tar: tarfile.TarFile, _sentinel: Path) -> None:
    info = tarfile.TarInfo("neg.py")
    info.size = -5  # base-256 in a GNU header
    tar.addfile(info)


DIR: dict[str, Any] = {"type": tarfile.DIRTYPE, "data": b""}

CRAFTED = [
    Crafted("dotdot", _each(("../sentinel/evil.py", {})), "'../sentinel/evil.py' points outside"),
    Crafted(
        "dotdot-deep",
        _each(("pkg/../../sentinel/evil.py", {})),
        "points outside the workdir",
    ),
    Crafted(
        "absolute",
        lambda tar, sentinel: _add(tar, str(sentinel / "evil.py")),
        "has an absolute path",
    ),
    Crafted("pax-path-dotdot", _pax_path("../sentinel/evil.py"), "points outside the workdir"),
    Crafted("pax-path-absolute", _pax_path("/tmp/evil.py"), r"'/tmp/evil.py' has an absolute"),
    Crafted("pax-path-nul", _pax_path("ok.py\x00../../evil"), "has a NUL byte in its name"),
    Crafted(
        "pax-global-path",
        lambda tar, _s: _add(tar, "benign.py"),
        "points outside the workdir",
        global_pax={"path": "../sentinel/evil.py"},
    ),
    Crafted(
        "gnu-longname-dotdot",
        _each(("d" * 110 + "/../../sentinel/evil.py", {})),
        r"'ddd.*points outside the workdir",
        format=tarfile.GNU_FORMAT,
    ),
    Crafted(
        "gnu-longname-raw",
        _headed(tarfile.GNUTYPE_LONGNAME, b"../sentinel/evil.py\x00", "benign.py"),
        "'../sentinel/evil.py' points outside",
        format=tarfile.GNU_FORMAT,
    ),
    Crafted("backslash", _each(("..\\sentinel\\evil.py", {})), "has a backslash"),
    Crafted("control-char", _each(("evil\n.py", {})), "has a control character"),
    Crafted(
        "not-utf8",
        _each(("evil-\udcff.py", {})),
        "is not UTF-8",
        format=tarfile.USTAR_FORMAT,
    ),
    Crafted("name-too-long", _each(("a" * 1100, {})), "1100-byte name; at most 1024"),
    Crafted("too-deep", _each(("a/" * 70 + "f.py", {})), "nests 71 levels deep; at most 64"),
    Crafted("component-too-long", _each(("a" * 300 + ".py", {})), "component longer than 255"),
    Crafted(
        "symlink-out",
        _each(("link", {"type": tarfile.SYMTYPE, "linkname": "../sentinel"})),
        r"'link' is a link \(symbolic, to '../sentinel'\)",
    ),
    Crafted(
        "symlink-then-write-through",
        _each(
            ("pkg", {"type": tarfile.SYMTYPE, "linkname": "/tmp"}),
            ("pkg/evil.py", {}),
        ),
        "'pkg' is a link",
    ),
    Crafted(
        "hardlink-out",
        _each(("hard", {"type": tarfile.LNKTYPE, "linkname": "../sentinel/secret"})),
        r"'hard' is a link \(hard, to '../sentinel/secret'\)",
    ),
    Crafted(
        "char-device",
        _each(("null", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3, "data": b""})),
        "'null' is a character device, not a regular file or directory",
    ),
    Crafted(
        "block-device",
        _each(("sda", {"type": tarfile.BLKTYPE, "data": b""})),
        "is a block device, not a regular file",
    ),
    Crafted(
        "fifo",
        _each(("pipe", {"type": tarfile.FIFOTYPE, "data": b""})),
        "'pipe' is a FIFO, not a regular file",
    ),
    Crafted(
        "gnu-sparse",
        _each(("holes.bin", {"type": tarfile.GNUTYPE_SPARSE})),
        "sparse files are not accepted",
        format=tarfile.GNU_FORMAT,
    ),
    Crafted(
        "pax-sparse-map",
        _headed(
            tarfile.XHDTYPE,
            _pax_record("GNU.sparse.major", "1") + _pax_record("GNU.sparse.minor", "0"),
            "holes.bin",
        ),
        "GNU sparse file",
    ),
    Crafted(
        "file-then-dir",
        _each(("data", {}), ("data", DIR)),
        "'data' appears both as a file and as a directory",
    ),
    Crafted(
        "dir-then-file",
        _each(("data", DIR), ("data", {})),
        "'data' appears both as a file and as a directory",
    ),
    Crafted(
        "file-then-inside",
        _each(("data", {}), ("data/x.py", {})),
        "'data/x.py' lies inside 'data', which is a file",
    ),
    Crafted("duplicate-file", _each(("train.py", {})), "'train.py' appears twice"),
    Crafted(
        "duplicate-spelled-apart",
        _each(("./train.py", {})),
        "'train.py' appears twice",
    ),
    Crafted("duplicate-dir", _each(("pkg", DIR), ("pkg/", DIR)), "'pkg' appears twice"),
    Crafted(
        "pax-header-oversized",
        _headed(tarfile.XHDTYPE, _pax_record("comment", "x" * 100_000)),
        r"100016-byte extended \(PAX or GNU long name\) header at byte 1024; at most 65536",
    ),
    Crafted(
        "gnu-longname-oversized",
        _headed(tarfile.GNUTYPE_LONGNAME, b"a" * 70_000),
        "70000-byte extended",
        format=tarfile.GNU_FORMAT,
    ),
    Crafted(
        # tarfile recurses once per extended header: 2000 of them were a RecursionError (a 500)
        "pax-header-chain",
        _headed(tarfile.XHDTYPE, _pax_record("comment", "x"), times=2000),
        "more than 8 extended .* headers in a row",
    ),
    Crafted(
        # quadratic in the standard library's PAX parser before 3.11.10 (CVE-2024-6232)
        "pax-header-redos",
        _headed(tarfile.XHDTYPE, b"2 " * 30_000 + b"=\n"),
        "malformed PAX header",
    ),
    Crafted(
        "negative-size",
        _negative_size,
        "negative size",
        format=tarfile.GNU_FORMAT,
    ),
    Crafted(
        "too-many-members",
        _many(25),
        "more than 20 members",
        limits=SMALL,
    ),
    Crafted(
        "declared-size-bomb",
        lambda tar, _s: _zeros(tar, "big.bin", 100_000),
        r"past the 64\.0 KiB limit: its files declare .* 'big.bin'",
        limits=SMALL,
    ),
    Crafted(
        "pax-size-bomb",
        _headed(tarfile.XHDTYPE, _pax_record("size", str(3 << 30)), "big.bin"),
        r"past the 2\.0 GiB limit: its files declare",
    ),
    Crafted(
        # 800 empty files declare 0 bytes, but their headers inflate to 400 KiB
        "header-bomb",
        _many(800, b""),
        r"inflates past the 256\.0 KiB limit on uncompressed data",
        limits=ArchiveLimits(inflated_bytes=256 * 1024),
    ),
    Crafted(
        "ratio-bomb",
        lambda tar, _s: _zeros(tar, "zeros.bin", 60_000),
        "inflates more than 20 times its compressed size",
        limits=ArchiveLimits(ratio=20, ratio_floor=16 * 1024),
    ),
]


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
    Crafted("many", _many(30), "").build(archive, sentinel)
    assert len(list_members(archive)) == 31
    monkeypatch.setattr(workdir, "DEFAULT_LIMITS", SMALL)
    with pytest.raises(ArchiveError, match="more than 20 members"):
        list_members(archive)


def test_gzip_bomb_stops_reading_at_the_cap(tmp_path: Path) -> None:
    """A 50 MiB run of zeros in a ~50 KiB upload: refused after reading about the ratio's
    worth, not after inflating everything."""
    archive, target, sentinel = _case_dirs(tmp_path)
    with tarfile.open(archive, "w:gz", compresslevel=9) as tar:
        _zeros(tar, "zeros.bin", 50 << 20)
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
        _add(tar, "./", **DIR)
        _add(tar, "./pkg/", **DIR)
        _add(tar, "./train.py", b"run\n", mode=0o4777)
        _add(tar, long_name, b"long\n")
        _add(tar, "pkg/sub/deep.py", b"deep\n", mode=0o644)
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
    record = _pax_record("path", "a/b.py") + _pax_record("mtime", "1700000000.5")
    assert workdir._pax_records(record + b"\0" * 20, 0) == {
        "path": "a/b.py",
        "mtime": "1700000000.5",
    }
    for bad in (b"x path=a\n", b"99 path=a\n", b"9 patha\n\n", b"8 path=\xff\n", b"0 =\n"):
        with pytest.raises(ArchiveError, match="malformed PAX header at byte 7"):
            workdir._pax_records(bad, 7)
