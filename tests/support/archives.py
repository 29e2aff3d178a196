"""Hostile workdir archives, shared by the archive tests (tests/unit/test_workdir.py) and the
upload tests (tests/unit/test_upload_safety.py): each :class:`Crafted` case builds a .tar.gz
that must be refused with an ArchiveError naming the rule and the member."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainhouse.jobfs.workdir import ArchiveLimits


def tar_of(tmp_path: Path, build: object) -> Path:
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        build(tar)  # type: ignore[operator]
    return path


def add_member(tar: tarfile.TarFile, name: str, data: bytes = b"x", **kw: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in kw.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data) if info.isfile() else None)


# Crafted uploads. Each case builds a hostile .tar.gz; list_members and extract must refuse it
# with an ArchiveError that names the rule and the member, and nothing may appear outside the
# extraction target. tests/unit/test_workdir.py feeds them to list_members and extract, and
# tests/unit/test_upload_safety.py posts the same archives to the API.

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
            add_member(tar, "train.py", b"print('hi')\n")
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


def pax_record(key: str, value: str) -> bytes:
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


def zeros_member(tar: tarfile.TarFile, name: str, size: int) -> None:
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
            add_member(tar, name, **kw)

    return members


def _headed(
    kind: bytes, data: bytes, name: str = "x.py", times: int = 1
) -> Callable[[tarfile.TarFile, Path], None]:
    """``times`` raw extended headers of ``kind`` holding ``data``, then the member ``name``."""

    def members(tar: tarfile.TarFile, _sentinel: Path) -> None:
        for _ in range(times):
            _header(tar, kind, data)
        add_member(tar, name)

    return members


def many_members(count: int, data: bytes = b"x") -> Callable[[tarfile.TarFile, Path], None]:
    def members(tar: tarfile.TarFile, _sentinel: Path) -> None:
        for i in range(count):
            add_member(tar, f"f{i}.py", data)

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
        lambda tar, sentinel: add_member(tar, str(sentinel / "evil.py")),
        "has an absolute path",
    ),
    Crafted("pax-path-dotdot", _pax_path("../sentinel/evil.py"), "points outside the workdir"),
    Crafted("pax-path-absolute", _pax_path("/tmp/evil.py"), r"'/tmp/evil.py' has an absolute"),
    Crafted("pax-path-nul", _pax_path("ok.py\x00../../evil"), "has a NUL byte in its name"),
    Crafted(
        "pax-global-path",
        lambda tar, _s: add_member(tar, "benign.py"),
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
            pax_record("GNU.sparse.major", "1") + pax_record("GNU.sparse.minor", "0"),
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
        _headed(tarfile.XHDTYPE, pax_record("comment", "x" * 100_000)),
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
        _headed(tarfile.XHDTYPE, pax_record("comment", "x"), times=2000),
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
        many_members(25),
        "more than 20 members",
        limits=SMALL,
    ),
    Crafted(
        "declared-size-bomb",
        lambda tar, _s: zeros_member(tar, "big.bin", 100_000),
        r"past the 64\.0 KiB limit: its files declare .* 'big.bin'",
        limits=SMALL,
    ),
    Crafted(
        "pax-size-bomb",
        _headed(tarfile.XHDTYPE, pax_record("size", str(3 << 30)), "big.bin"),
        r"past the 2\.0 GiB limit: its files declare",
    ),
    Crafted(
        # 800 empty files declare 0 bytes, but their headers inflate to 400 KiB
        "header-bomb",
        many_members(800, b""),
        r"inflates past the 256\.0 KiB limit on uncompressed data",
        limits=ArchiveLimits(inflated_bytes=256 * 1024),
    ),
    Crafted(
        "ratio-bomb",
        lambda tar, _s: zeros_member(tar, "zeros.bin", 60_000),
        "inflates more than 20 times its compressed size",
        limits=ArchiveLimits(ratio=20, ratio_floor=16 * 1024),
    ),
]
