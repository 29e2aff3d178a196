"""Packing a job's workdir on submit and unpacking it safely on the server.

Packing skips ``.git`` and honours ``.gitignore`` and ``.trainhouseignore`` (gitignore syntax,
read from the workdir root). Unpacking refuses anything that could escape the target directory:
absolute paths, ``..``, links, device files, and archives that inflate past the limits.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pathspec

from trainhouse.errors import ArchiveError

MAX_ARCHIVE_BYTES = 100 * 1024 * 1024
MAX_EXTRACTED_BYTES = 2 * 1024 * 1024 * 1024
MAX_MEMBERS = 100_000
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


def _check_member(member: tarfile.TarInfo) -> PurePosixPath:
    name = PurePosixPath(member.name)
    if name.is_absolute() or member.name.startswith(("/", "\\")):
        raise ArchiveError(f"archive member {member.name!r} has an absolute path")
    if ".." in name.parts:
        raise ArchiveError(f"archive member {member.name!r} points outside the workdir")
    if member.issym() or member.islnk():
        raise ArchiveError(f"archive member {member.name!r} is a link; links are not accepted")
    if not (member.isfile() or member.isdir()):
        raise ArchiveError(f"archive member {member.name!r} is not a regular file or directory")
    return name


def list_members(path: Path) -> list[str]:
    """Validate an archive without extracting it; returns the file names it holds."""
    names = []
    total = 0
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_MEMBERS:
                    raise ArchiveError(f"archive has more than {MAX_MEMBERS} members")
                _check_member(member)
                total += member.size
                if total > MAX_EXTRACTED_BYTES:
                    raise ArchiveError(
                        f"archive inflates past the {_human(MAX_EXTRACTED_BYTES)} limit"
                    )
                if member.isfile():
                    names.append(PurePosixPath(member.name).as_posix().removeprefix("./"))
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise ArchiveError(f"workdir upload is not a valid .tar.gz archive ({exc})") from None
    return names


def extract(archive: Path, target: Path) -> None:
    """Extract a validated archive into an empty ``target`` directory."""
    target.mkdir(parents=True, exist_ok=False)
    list_members(archive)
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for member in tar:
                rel = _check_member(member)
                dest = target.joinpath(*rel.parts)
                if member.isdir():
                    dest.mkdir(parents=True, exist_ok=True)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                if src is None:
                    continue
                with src, dest.open("wb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                mode = stat.S_IMODE(member.mode) & 0o755 | 0o600
                dest.chmod(mode)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"cannot extract workdir archive ({exc})") from None
