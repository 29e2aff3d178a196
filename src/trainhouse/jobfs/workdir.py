"""Packing a job's workdir on submit and unpacking it safely on the server.

Packing skips ``.git`` and honours ``.gitignore`` and ``.trainhouseignore`` (gitignore syntax,
read from the workdir root).

Unpacking treats the upload as hostile. The archive is read once, front to back, as a stream
(``list_members`` validates everything before ``extract`` writes a byte), and refuses:

- names that are absolute, hold ``..``, a backslash, a NUL or another control character, are not
  UTF-8, are longer than ``name_bytes`` or nest deeper than ``depth`` directories, whether they
  come from the tar header, a PAX ``path`` record or a GNU long name;
- anything but regular files and directories: symbolic and hard links (wherever they point),
  devices, FIFOs, sparse files;
- a path given twice, as a file and a directory, or a file with members inside it;
- PAX and GNU long-name headers past ``header_bytes`` or more than ``headers_per_member`` of them
  in a row, and malformed PAX records (they are parsed here, in linear time: the standard
  library's parser is quadratic on crafted records before Python 3.11.10);
- bombs: more than ``members`` members, file contents past ``extracted_bytes`` (declared in the
  headers, and counted again as written), a decompressed stream past ``inflated_bytes``, or one
  that inflates more than ``ratio`` times the upload once past ``ratio_floor``.

Each file is created with ``O_EXCL | O_NOFOLLOW`` in a directory whose real path is checked to
lie inside the target, so even a link planted in the target cannot redirect a write. A file keeps
its owner's and group's and others' read and execute bits, less those the process's umask takes
away (the server's is 077: only its user may read a job's code).
"""

from __future__ import annotations

import gzip
import io
import itertools
import os
import re
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import pathspec

from trainhouse.core.errors import ArchiveError
from trainhouse.jobfs.hardening import umask

_MIB = 1024 * 1024
MAX_ARCHIVE_BYTES = 100 * _MIB  # the upload (compressed): Settings.max_upload_bytes
MAX_EXTRACTED_BYTES = 2 * 1024 * _MIB  # file contents once unpacked
MAX_INFLATED_BYTES = MAX_EXTRACTED_BYTES + 256 * _MIB  # the whole tar stream: + headers, padding
MAX_MEMBERS = 100_000
MAX_RATIO = 200  # inflated bytes per compressed byte; source code packs 3 to 10 times
RATIO_FLOOR = 64 * _MIB  # inflated bytes below which the ratio is not checked
MAX_HEADER_BYTES = 64 * 1024  # one PAX header or GNU long name
MAX_HEADER_CHAIN = 8  # PAX / GNU long-name headers in front of one member
MAX_NAME_BYTES = 1024  # a member's path, UTF-8
MAX_COMPONENT_BYTES = 255  # one path component (NAME_MAX)
MAX_DEPTH = 64  # directories a member's path nests
IGNORE_FILES = (".gitignore", ".trainhouseignore")
ALWAYS_SKIPPED = (".git/", "__pycache__/", ".venv/", ".trainhouse/")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def human_size(n: float) -> str:
    return _human(n)


@dataclass(frozen=True)
class PackedWorkdir:
    data: bytes
    files: int
    raw_bytes: int


def _ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    lines = list(ALWAYS_SKIPPED)
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            lines.extend(path.read_text(errors="replace").splitlines())
    return pathspec.GitIgnoreSpec.from_lines(lines)


def iter_files(root: Path) -> list[tuple[Path, str]]:
    """(absolute path, archive name) of every file packed from ``root``."""
    spec = _ignore_spec(root)
    out: list[tuple[Path, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        keep = []
        for d in sorted(dirnames):
            rel = (rel_dir / d).as_posix() + "/"
            if not spec.match_file(rel) and not (Path(dirpath) / d).is_symlink():
                keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = (rel_dir / f).as_posix()
            full = Path(dirpath) / f
            if spec.match_file(rel) or full.is_symlink() or not full.is_file():
                continue
            out.append((full, rel))
    return out


def pack(root: Path, limit: int = MAX_ARCHIVE_BYTES) -> PackedWorkdir:
    """Pack ``root`` into a gzip'd tar in memory, refusing one over ``limit`` bytes."""
    root = Path(root)
    if not root.is_dir():
        raise ArchiveError(f"workdir {root} is not a directory")
    files = iter_files(root)
    buf = io.BytesIO()
    raw = 0
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for full, rel in files:
            info = tar.gettarinfo(str(full), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            raw += info.size
            with full.open("rb") as fh:
                tar.addfile(info, fh)
            if buf.tell() > limit:
                break
    if buf.tell() > limit:
        largest = sorted(files, key=lambda fr: fr[0].stat().st_size, reverse=True)[:5]
        listing = ", ".join(f"{rel} ({_human(full.stat().st_size)})" for full, rel in largest)
        total = sum(full.stat().st_size for full, _ in files)
        raise ArchiveError(
            f"workdir {root} packs to more than {_human(limit)} (over {_human(buf.tell())} "
            f"compressed, {_human(total)} in {len(files)} files); largest files: {listing}. "
            "Keep data and checkpoints out of the workdir or list them in .trainhouseignore"
        )
    return PackedWorkdir(buf.getvalue(), len(files), raw)


# ---------------------------------------------------------------------------------------------
# Unpacking an upload


@dataclass(frozen=True)
class ArchiveLimits:
    """What an uploaded archive may hold; the defaults are the module's ``MAX_*`` constants."""

    members: int = MAX_MEMBERS
    extracted_bytes: int = MAX_EXTRACTED_BYTES
    inflated_bytes: int = MAX_INFLATED_BYTES
    ratio: int = MAX_RATIO
    ratio_floor: int = RATIO_FLOOR
    header_bytes: int = MAX_HEADER_BYTES
    headers_per_member: int = MAX_HEADER_CHAIN
    name_bytes: int = MAX_NAME_BYTES
    depth: int = MAX_DEPTH


#: the limits ``list_members`` and ``extract`` apply when none are given (looked up per call)
DEFAULT_LIMITS = ArchiveLimits()

_BLOCK = tarfile.BLOCKSIZE
_UNSAFE_CHAR = re.compile(r"[\x00-\x1f\x7f\\]")
_EXTENDED = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)
_KINDS = {
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
}


def _show(name: str) -> str:
    """A member name for a message: quoted, escaped (control characters, NUL, surrogates),
    and cut short when it is long."""
    shown = repr(name)
    if len(shown) <= 120:
        return shown
    return f"{shown[:100]}...' ({len(name)} characters)"


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


class _Inflating:
    """The upload's decompressed bytes, counted as tarfile reads them: the caps on inflated
    bytes and on the compression ratio hold for what is actually decompressed, headers and
    padding included, whatever the tar headers claim."""

    def __init__(self, raw: Any, compressed: int, limits: ArchiveLimits) -> None:
        self._gzip = gzip.GzipFile(fileobj=raw, mode="rb")
        self.compressed = compressed
        self.inflated = 0
        self._limits = limits
        by_ratio = max(limits.ratio_floor, limits.ratio * compressed)
        self._cap = min(limits.inflated_bytes, by_ratio)

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > _MIB:  # never decompress an unbounded amount in one call
            size = _MIB
        data = self._gzip.read(size)
        self.inflated += len(data)
        if self.inflated > self._cap:
            limits = self._limits
            if self._cap == limits.inflated_bytes:
                raise ArchiveError(
                    f"archive inflates past the {_human(limits.inflated_bytes)} limit on "
                    f"uncompressed data (read {_human(self.inflated)} from "
                    f"{_human(self.compressed)} compressed)"
                )
            raise ArchiveError(
                f"archive inflates more than {limits.ratio} times its compressed size of "
                f"{_human(self.compressed)} (read {_human(self.inflated)}, past "
                f"{_human(self._cap)}); a decompression bomb is refused"
            )
        return data

    def tell(self) -> int:
        return self.inflated

    def write(self, _data: bytes) -> int:
        raise io.UnsupportedOperation("read only")

    def seek(self, _pos: int) -> int:
        raise io.UnsupportedOperation("a stream is read front to back")

    def close(self) -> None:
        self._gzip.close()


def _pax_records(data: bytes, offset: int) -> dict[str, str]:
    """The ``"%d %s=%s\\n"`` records of a PAX header, parsed strictly in one linear pass."""

    def bad(why: str) -> ArchiveError:
        return ArchiveError(f"archive has a malformed PAX header at byte {offset}: {why}")

    records: dict[str, str] = {}
    pos, end_all = 0, len(data)
    while pos < end_all:
        if data[pos] == 0:  # NUL padding ends the records
            if data.count(0, pos) != end_all - pos:
                raise bad("data after the NUL padding")
            break
        space = data.find(b" ", pos, pos + 21)
        digits = data[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise bad("a record must start with its length in decimal digits")
        end = pos + int(digits)
        if end > end_all or end <= space + 2 or data[end - 1] != 0x0A:
            raise bad(f"a record's length ({int(digits)}) does not end it at a newline")
        equals = data.find(b"=", space + 1, end - 1)
        if equals <= space + 1:
            raise bad("a record must be keyword=value")
        try:
            keyword = data[space + 1 : equals].decode("utf-8")
            value = data[equals + 1 : end - 1].decode("utf-8")
        except UnicodeDecodeError:
            raise bad("records must be UTF-8 (names in other encodings are refused)") from None
        records[keyword] = value
        pos = end
    return records


class _CheckedTarInfo(tarfile.TarInfo):
    """TarInfo whose header processing refuses, before tarfile acts on a header, what could
    exhaust memory or time: oversized or chained extended headers, sparse maps, malformed PAX
    records, negative sizes. ``limits`` and ``chain`` are set per archive (a subclass each)."""

    limits: ClassVar[ArchiveLimits] = DEFAULT_LIMITS
    chain: ClassVar[list[int]] = [0]  # extended headers read for the member being assembled

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        limits = self.limits
        if self.size < 0:
            raise ArchiveError(
                f"archive header at byte {self.offset} declares a negative size ({self.size})"
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise ArchiveError(
                f"archive member {_show(self.name)} is a sparse file; sparse files are not accepted"
            )
        if self.type in _EXTENDED:
            if self.size > limits.header_bytes:
                raise ArchiveError(
                    f"archive has a {self.size}-byte extended (PAX or GNU long name) header at "
                    f"byte {self.offset}; at most {limits.header_bytes} bytes are accepted"
                )
            self.chain[0] += 1
            if self.chain[0] > limits.headers_per_member:
                raise ArchiveError(
                    f"archive has more than {limits.headers_per_member} extended (PAX or GNU "
                    f"long name) headers in a row at byte {self.offset}"
                )
        else:
            self.chain[0] = 0
        member: tarfile.TarInfo = tarfile.TarInfo._proc_member(self, tar)  # type: ignore[attr-defined]
        return member

    def _proc_pax(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        """What ``TarInfo._proc_pax`` does, with a linear parser that refuses malformed records
        and GNU sparse maps."""
        stream: Any = tar.fileobj
        buf: bytes = stream.read(_padded(self.size))
        if len(buf) < self.size:
            raise tarfile.ReadError("unexpected end of data")
        records = _pax_records(buf[: self.size], self.offset)
        sparse = next((k for k in records if k.startswith("GNU.sparse.")), None)
        if sparse is not None:
            raise ArchiveError(
                f"archive has a GNU sparse file (PAX record {sparse!r} at byte {self.offset}); "
                "sparse files are not accepted"
            )
        shared: Any = tar.pax_headers
        if self.type == tarfile.XGLTYPE:  # a global header applies to every later member
            shared.update(records)
            headers = shared
        else:
            headers = {**shared, **records}
        try:
            following: Any = self.fromtarfile(tar)
        except tarfile.HeaderError as exc:
            raise tarfile.ReadError(str(exc)) from None  # what tarfile makes of it
        if self.type != tarfile.XGLTYPE:
            following._apply_pax_info(headers, tar.encoding, tar.errors)
            following.offset = self.offset
            if "size" in headers:  # the record replaces the size: the next header moves
                offset = following.offset_data
                if following.isreg() or following.type not in tarfile.SUPPORTED_TYPES:
                    offset += _padded(following.size)
                tar.offset = offset
        result: tarfile.TarInfo = following
        return result


def _tarinfo_class(limits: ArchiveLimits) -> type[_CheckedTarInfo]:
    class PerArchive(_CheckedTarInfo):
        pass

    PerArchive.limits = limits
    PerArchive.chain = [0]
    return PerArchive


def _check_member(member: tarfile.TarInfo, limits: ArchiveLimits | None = None) -> tuple[str, ...]:
    """The member's path components, or ArchiveError naming the rule and the member."""
    limits = limits or DEFAULT_LIMITS
    raw = member.name
    shown = _show(raw)
    if raw.startswith(("/", "\\")):
        raise ArchiveError(f"archive member {shown} has an absolute path")
    if "\x00" in raw:
        raise ArchiveError(f"archive member {shown} has a NUL byte in its name")
    if "\\" in raw:
        raise ArchiveError(
            f"archive member {shown} has a backslash in its name; paths use / between "
            "directories and names may not hold a backslash"
        )
    if _UNSAFE_CHAR.search(raw):
        raise ArchiveError(f"archive member {shown} has a control character in its name")
    try:
        size = len(raw.encode("utf-8"))
    except UnicodeEncodeError:
        raise ArchiveError(f"archive member {shown} has a name that is not UTF-8") from None
    if size > limits.name_bytes:
        raise ArchiveError(
            f"archive member {shown} has a {size}-byte name; at most {limits.name_bytes} bytes"
        )
    parts = PurePosixPath(raw).parts
    if ".." in parts:
        raise ArchiveError(f"archive member {shown} points outside the workdir")
    if len(parts) > limits.depth:
        raise ArchiveError(
            f"archive member {shown} nests {len(parts)} levels deep; at most {limits.depth}"
        )
    for part in parts:
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise ArchiveError(
                f"archive member {shown} has a path component longer than "
                f"{MAX_COMPONENT_BYTES} bytes"
            )
    if member.issym() or member.islnk():
        kind = "symbolic" if member.issym() else "hard"
        raise ArchiveError(
            f"archive member {shown} is a link ({kind}, to {_show(member.linkname)}); links "
            "are not accepted"
        )
    if member.issparse():
        raise ArchiveError(
            f"archive member {shown} is a sparse file; sparse files are not accepted"
        )
    if not (member.isfile() or member.isdir()):
        kind = _KINDS.get(member.type, f"member of type {member.type!r}")
        raise ArchiveError(f"archive member {shown} is a {kind}, not a regular file or directory")
    if member.size < 0:
        raise ArchiveError(f"archive member {shown} declares a negative size ({member.size})")
    if member.isfile() and not parts:
        raise ArchiveError(f"archive member {shown} is a file without a name")
    return parts


def _scan(
    archive: Path, limits: ArchiveLimits
) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo, tuple[str, ...]]]:
    """Each member of a .tar.gz, checked, with its path components; one pass, front to back.

    Contents of a member are readable (``tar.extractfile``) until the next one is asked for.
    """
    try:
        with archive.open("rb") as raw:
            stream = _Inflating(raw, os.fstat(raw.fileno()).st_size, limits)
            tarinfo = _tarinfo_class(limits)
            with tarfile.open(fileobj=stream, mode="r|", tarinfo=tarinfo) as tar:
                count = 0
                declared = 0
                while (member := tar.next()) is not None:
                    tar.members.clear()  # type: ignore[attr-defined]  # read once: keep no TarInfo
                    count += 1
                    if count > limits.members:
                        raise ArchiveError(
                            f"archive has more than {limits.members} members (files and "
                            "directories)"
                        )
                    parts = _check_member(member, limits)
                    if member.isfile():
                        declared += member.size
                        if declared > limits.extracted_bytes:
                            raise ArchiveError(
                                f"archive inflates past the {_human(limits.extracted_bytes)} "
                                f"limit: its files declare over {_human(declared)} (member "
                                f"{_show(member.name)} declares {_human(member.size)})"
                            )
                    yield tar, member, parts
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
        raise ArchiveError(f"workdir upload is not a valid .tar.gz archive ({exc})") from None


def _check_layout(entries: list[tuple[str, bool]]) -> None:
    """Each path once; no path both a file and a directory; nothing inside a file.

    ``entries`` are (components joined by NUL, is a directory): sorted, a path's descendants
    directly follow it (NUL sorts first, and names hold none).
    """
    entries.sort(key=lambda entry: entry[0])  # stable: duplicates keep the archive's order
    for (key, is_dir), (next_key, next_is_dir) in itertools.pairwise(entries):
        shown = _show(key.replace("\x00", "/"))
        if key == next_key:
            if is_dir != next_is_dir:
                raise ArchiveError(
                    f"archive member {shown} appears both as a file and as a directory"
                )
            raise ArchiveError(f"archive member {shown} appears twice; each path may appear once")
        if not is_dir and next_key.startswith(key + "\x00"):
            raise ArchiveError(
                f"archive member {_show(next_key.replace(chr(0), '/'))} lies inside {shown}, "
                "which is a file"
            )


def list_members(path: Path, limits: ArchiveLimits | None = None) -> list[str]:
    """Validate an archive without extracting it; returns the file names it holds."""
    limits = limits or DEFAULT_LIMITS
    names: list[str] = []
    entries: list[tuple[str, bool]] = []
    for _tar, member, parts in _scan(path, limits):
        if not parts:  # the root directory ("./")
            continue
        entries.append(("\x00".join(parts), member.isdir()))
        if member.isfile():
            names.append("/".join(parts))
    _check_layout(entries)
    return names


def _confined(root: Path, path: Path, name: str) -> None:
    """Refuse ``path`` unless its real location (links resolved) is inside ``root``."""
    real = Path(os.path.realpath(path))
    if real != root and root not in real.parents:
        raise ArchiveError(
            f"archive member {_show(name)} would be written outside the workdir (to {real})"
        )


def _directory(root: Path, parts: tuple[str, ...], name: str) -> Path:
    """Create ``root/parts`` one level at a time; every level must be a real directory."""
    current = root
    for part in parts:
        current = current / part
        try:
            current.mkdir()
        except FileExistsError:
            if not stat.S_ISDIR(current.lstat().st_mode):
                where = current.relative_to(root).as_posix()
                raise ArchiveError(
                    f"archive member {_show(name)} needs {where!r} to be a directory, but it "
                    "is a file or a link"
                ) from None
    _confined(root, current, name)
    return current


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
_CREATE |= getattr(os, "O_CLOEXEC", 0)


def extract(archive: Path, target: Path, limits: ArchiveLimits | None = None) -> None:
    """Extract a validated archive into ``target``, which must not exist yet.

    On any error ``target`` is removed again and ArchiveError says why.
    """
    limits = limits or DEFAULT_LIMITS
    target.mkdir(parents=True, exist_ok=False)
    masked = umask()  # no file gets bits the process's umask takes away (the server's: 077)
    try:
        list_members(archive, limits)
        root = target.resolve(strict=True)
        written = 0
        for tar, member, parts in _scan(archive, limits):
            if member.isdir():
                _directory(root, parts, member.name)
                continue
            parent = _directory(root, parts[:-1], member.name)
            dest = parent / parts[-1]
            _confined(root, dest, member.name)
            src = tar.extractfile(member)
            if src is None:  # pragma: no cover - regular files always have contents
                raise ArchiveError(f"archive member {_show(member.name)} has no contents")
            try:
                fd = os.open(dest, _CREATE, 0o600)
            except FileExistsError:
                raise ArchiveError(
                    f"archive member {_show(member.name)} appears twice; each path may appear once"
                ) from None
            with src, os.fdopen(fd, "wb") as out:
                while chunk := src.read(_MIB):
                    written += len(chunk)
                    if written > limits.extracted_bytes:
                        raise ArchiveError(
                            f"archive inflates past the {_human(limits.extracted_bytes)} limit "
                            f"(while writing {_show(member.name)})"
                        )
                    out.write(chunk)
                os.fchmod(out.fileno(), (stat.S_IMODE(member.mode) & 0o755 | 0o600) & ~masked)
    except ArchiveError:
        shutil.rmtree(target, ignore_errors=True)
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
        shutil.rmtree(target, ignore_errors=True)
        raise ArchiveError(f"cannot extract workdir archive ({exc})") from None
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
