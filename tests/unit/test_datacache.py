"""The node's dataset cache (:mod:`trainhouse.jobfs.datacache`) on real files, with real
processes staging at once: what a rank is given, what is fetched once, what a changed source or
a failing one leaves, the least recently used removal, and a cache someone planted symlinks in.
"""

from __future__ import annotations

import errno
import hashlib
import io
import itertools
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainhouse.core.datasets import FileEntry, Manifest
from trainhouse.core.errors import StagingError
from trainhouse.jobfs import datacache
from trainhouse.jobfs.datacache import DataCache, Staged


def entry(path: str, data: bytes, algorithm: str = "sha256") -> FileEntry:
    return FileEntry(path, len(data), algorithm, hashlib.new(algorithm, data).hexdigest())


def manifest(files: dict[str, bytes], md5: tuple[str, ...] = ()) -> Manifest:
    return Manifest.of(entry(p, d, "md5" if p in md5 else "sha256") for p, d in files.items())


class Source:
    """The files' bytes by path; every fetch is counted."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.fetched: list[str] = []

    def __call__(self, e: FileEntry) -> io.BytesIO:
        self.fetched.append(e.path)
        return io.BytesIO(self.files[e.path])


def refuse(e: FileEntry) -> io.BytesIO:
    raise AssertionError(f"{e.path} fetched again")


class Failing:
    """A stream that gives ``first`` then raises ``exc``."""

    def __init__(self, first: bytes, exc: BaseException) -> None:
        self.first, self.exc = first, exc

    def read(self, n: int = -1) -> bytes:
        if self.first:
            chunk, self.first = self.first, b""
            return chunk
        raise self.exc

    def __enter__(self) -> Failing:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def tree(path: Path) -> dict[str, bytes]:
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def obj(root: Path, data: bytes) -> Path:
    hexdigest = hashlib.sha256(data).hexdigest()
    return root / "objects" / "sha256" / hexdigest[:2] / hexdigest


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if not p.is_dir()] if path.exists() else []


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datacache, "RETRY_DELAYS", (0.0, 0.0))


FILES = {
    "a.txt": b"alpha\n",
    "sub/dir/b.bin": bytes(range(256)) * 12,
    "sub/empty": b"",
    "sub/c.md5": b"checksummed by the store",
}


def test_stage_gives_a_read_only_verified_tree_and_reuses_it(root: Path) -> None:
    m = manifest(FILES, md5=("sub/c.md5",))
    source, reports = Source(FILES), list[tuple[int, int]]()
    with DataCache(root).stage(m, source, progress=lambda d, t: reports.append((d, t))) as staged:
        assert staged.path == root / "views" / m.digest
        assert staged.digest == m.digest
        assert tree(staged.path) == FILES  # the files only: no marker inside
        assert sorted(p.name for p in staged.path.iterdir()) == ["a.txt", "sub"]
        assert (staged.fetched_bytes, staged.reused) == (m.size, 0)
        for path in [staged.path, *staged.path.rglob("*")]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert mode == (0o555 if path.is_dir() else 0o444), path
    assert sorted(source.fetched) == sorted(FILES)
    assert reports[-1] == (m.size, m.size)
    assert all(a[0] < b[0] for a, b in itertools.pairwise(reports))
    assert files_under(root / ".tmp") == []

    # a second stage, or one after a restart (a new process: only the files), fetches nothing
    reports.clear()
    with DataCache(root).stage(m, refuse, progress=lambda d, t: reports.append((d, t))) as again:
        assert (again.path, again.fetched_bytes, again.reused) == (staged.path, 0, len(FILES))
        assert tree(again.path) == FILES
    assert reports == [(m.size, m.size)]


def test_versions_sharing_a_file_store_its_bytes_once(root: Path) -> None:
    shared = b"shared bytes " * 100
    one = {"x": shared, "y": b"one"}
    two = {"data/x2": shared, "data/copy": shared, "z": b"two"}
    cache = DataCache(root)
    first = cache.stage(manifest(one), Source(one))
    source = Source(two)
    second = cache.stage(manifest(two), source)
    assert source.fetched == ["z"]  # the shared bytes are already there, twice in `two`
    assert (second.fetched_bytes, second.reused) == (3, 2)
    inodes = {(p / n).stat().st_ino for p, n in [(first.path, "x"), (second.path, "data/x2")]}
    assert inodes == {(second.path / "data/copy").stat().st_ino, obj(root, shared).stat().st_ino}
    assert cache.total_bytes() == len(shared) + 3 + 3
    assert sorted(v.size for v in cache.usage()) == sorted([len(shared) + 3, len(shared) + 3])
    first.release()
    second.release()


# -- processes staging at once


def _concurrent_files(version: int) -> dict[str, bytes]:
    files = {f"shards/part-{i}.bin": bytes([i]) * (20_000 + i) for i in range(6)}
    files[f"only-{version}.txt"] = f"version {version}".encode()
    return files


# a process staging version ARGV[3] of the files above once ARGV[4] exists; every fetch appended
# to ARGV[2]; what it got written to ARGV[5]
_CHILD = """
import hashlib, io, json, sys, time
from pathlib import Path
from trainhouse.core.datasets import FileEntry, Manifest
from trainhouse.jobfs.datacache import DataCache

root, counter, version, go, out = sys.argv[1:]
files = {f"shards/part-{i}.bin": bytes([i]) * (20_000 + i) for i in range(6)}
files[f"only-{version}.txt"] = f"version {version}".encode()
entries = [FileEntry(p, len(d), "sha256", hashlib.sha256(d).hexdigest()) for p, d in files.items()]

def fetch(e):
    with open(counter, "a") as f:
        f.write(e.key + "\\n")
    time.sleep(0.01)  # a slow source: the others arrive while it downloads
    return io.BytesIO(files[e.path])

while not Path(go).exists():
    time.sleep(0.002)
with DataCache(Path(root)).stage(Manifest.of(entries), fetch) as staged:
    got = {p.relative_to(staged.path).as_posix(): p.read_bytes()
           for p in staged.path.rglob("*") if p.is_file()}
    result = {"path": str(staged.path), "fetched": staged.fetched_bytes, "complete": got == files}
Path(out).write_text(json.dumps(result))
"""


def _stage_at_once(tmp_path: Path, versions: list[int]) -> tuple[list[dict[str, Any]], list[str]]:
    go, counter = tmp_path / "go", tmp_path / "fetches"
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CHILD,
                str(tmp_path / "cache"),
                str(counter),
                str(v),
                str(go),
                str(tmp_path / f"{i}.json"),
            ]
        )
        for i, v in enumerate(versions)
    ]
    go.touch()
    for child in children:
        assert child.wait(60) == 0
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(len(versions))]
    return results, counter.read_text().split()


def test_processes_staging_one_version_at_once_fetch_each_file_once(tmp_path: Path) -> None:
    results, fetched = _stage_at_once(tmp_path, [1, 1, 1, 1])
    m = manifest(_concurrent_files(1))
    assert sorted(fetched) == sorted(e.key for e in m.files)  # each exactly once
    assert all(r["complete"] and r["path"] == results[0]["path"] for r in results)
    assert sum(r["fetched"] for r in results) == m.size
    assert files_under(tmp_path / "cache" / ".tmp") == []


def test_processes_staging_versions_sharing_files_fetch_each_file_once(tmp_path: Path) -> None:
    results, fetched = _stage_at_once(tmp_path, [1, 2, 1, 2])
    keys = {e.key for v in (1, 2) for e in manifest(_concurrent_files(v)).files}
    assert sorted(fetched) == sorted(keys)
    assert all(r["complete"] for r in results)
    assert len({r["path"] for r in results}) == 2


# -- failures


@pytest.mark.parametrize(
    ("source", "says"),
    [
        (b"hello, world", "changed since it was registered (size over 5, registered 5)"),
        (b"hel", "changed since it was registered (size 3, registered 5)"),
        (b"HELLO", "changed since it was registered (its sha256 digest differs"),
    ],
)
def test_a_changed_source_fails_and_leaves_nothing(root: Path, source: bytes, says: str) -> None:
    files = {"a.txt": b"fine", "data/f.bin": b"hello"}  # a.txt fetched first
    fetch = Source({**files, "data/f.bin": source})
    with pytest.raises(StagingError) as info:
        DataCache(root).stage(manifest(files), fetch)
    assert "dataset file 'data/f.bin'" in str(info.value) and says in str(info.value)
    assert not info.value.transient
    assert not obj(root, b"hello").exists() and not obj(root, source).exists()
    assert list((root / "views").iterdir()) == [] and list((root / ".ready").iterdir()) == []
    assert files_under(root / ".tmp") == []
    # the source fixed, the version stages (the file already there is reused)
    with DataCache(root).stage(manifest(files), Source(files)) as staged:
        assert tree(staged.path) == files and staged.reused == 1


@pytest.mark.parametrize(
    ("fails", "says"),
    [
        (FileNotFoundError(2, "No such file", "s3://b/f"), "is missing from its source"),
        (PermissionError(13, "Access denied"), "permission refused"),
        (OSError(errno.ENOSPC, "No space left"), "no space left on the node's dataset cache"),
        (StagingError("the store said 404"), "the store said 404"),
    ],
)
def test_a_failing_source_says_why(root: Path, fails: OSError, says: str) -> None:
    calls = []

    def fetch(e: FileEntry) -> Failing:
        calls.append(e.path)
        return Failing(b"part", fails)  # fails mid-read, after a partial file is written

    files = {"data/f.bin": b"hello world"}
    with pytest.raises(StagingError) as info:
        DataCache(root).stage(manifest(files), fetch)
    assert str(info.value).startswith("dataset file 'data/f.bin'") and says in str(info.value)
    assert not info.value.transient and calls == ["data/f.bin"]  # not tried again
    assert files_under(root / ".tmp") == [] and files_under(root / "objects") == []
    assert list((root / "views").iterdir()) == []


@pytest.mark.parametrize(
    "fails",
    [
        TimeoutError("timed out"),
        ConnectionResetError(104, "reset"),
        StagingError("503", transient=True),
    ],
)
def test_transient_failures_are_tried_again_then_raised_transient(
    root: Path, no_waits: None, fails: Exception
) -> None:
    files = {"f": b"bytes"}
    calls = []

    def fetch(e: FileEntry) -> Failing:
        calls.append(e.path)
        return Failing(b"", fails)

    with pytest.raises(StagingError) as info:
        DataCache(root).stage(manifest(files), fetch)
    assert info.value.transient and len(calls) == 3
    assert str(info.value).startswith("dataset file 'f'") and "(tried 3 times)" in str(info.value)
    assert files_under(root / "objects") == [] and files_under(root / ".tmp") == []

    def flaky(e: FileEntry) -> io.BytesIO | Failing:
        calls.append(e.path)
        return Failing(b"by", fails) if len(calls) < 5 else io.BytesIO(files[e.path])

    with DataCache(root).stage(manifest(files), flaky) as staged:
        assert tree(staged.path) == files and staged.fetched_bytes == 5
    assert len(calls) == 5


# -- the limit, least recently used first


def stage(cache: DataCache, files: dict[str, bytes], **kw: Any) -> Staged:
    return cache.stage(manifest(files), Source(files), **kw)


def test_prune_removes_the_least_recently_used_views_not_in_use(root: Path) -> None:
    shared = b"s" * 1000
    a, b, c = {"s": shared, "a": b"a" * 1000}, {"b": b"b" * 1000}, {"s": shared, "c": b"c" * 1000}
    cache = DataCache(root)
    stage(cache, a).release()
    stage(cache, b).release()
    held = stage(cache, c)
    stage(cache, a).release()  # used again: now the most recent
    digests = {manifest(f).digest: name for name, f in [("a", a), ("b", b), ("c", c)]}
    assert [(digests[v.digest], v.in_use) for v in cache.usage()] == [
        ("b", False),
        ("c", True),
        ("a", False),
    ]
    assert [v.size for v in cache.usage()] == [1000, 2000, 2000]

    removed = cache.prune(cache.total_bytes() - 1)
    assert [digests[v.digest] for v in removed] == ["b"]
    assert not obj(root, b["b"]).exists() and not (root / "views" / manifest(b).digest).exists()

    removed = cache.prune(0)  # all but the versions in use
    assert [digests[v.digest] for v in removed] == ["a"]
    assert not obj(root, a["a"]).exists()
    assert obj(root, shared).exists()  # c, held, links it
    assert tree(held.path) == c and cache.total_bytes() == 2000

    held.release()
    assert [digests[v.digest] for v in cache.prune(0)] == ["c"]
    assert cache.usage() == [] and cache.total_bytes() == 0
    assert files_under(root / "objects") == [] and list((root / "views").iterdir()) == []
    with DataCache(root).stage(manifest(a), Source(a)) as staged:  # gone: fetched again
        assert staged.fetched_bytes == 2000


def test_stage_makes_room_past_the_limit_and_says_so(root: Path) -> None:
    a, b, big = {"a": b"a" * 2000}, {"b": b"b" * 1000}, {"big": b"x" * 3000}
    cache, said = DataCache(root, max_bytes=2500), list[str]()
    stage(cache, a).release()
    held = stage(cache, b, out=said.append)
    assert [v.digest for v in cache.usage()] == [manifest(b).digest]
    assert said == [
        f"trainhouse: removed dataset version {manifest(a).digest[:12]} (2000 bytes, least "
        "recently used) from the node's dataset cache"
    ]
    said.clear()
    with stage(cache, big, out=said.append) as staged:  # alone over the limit: staged anyway
        assert tree(staged.path) == big
    assert said == [
        f"trainhouse: dataset version {manifest(big).digest[:12]} is 3000 bytes, over the node's "
        "dataset cache limit of 2500 bytes: staging it anyway"
    ]
    assert tree(held.path) == b  # in use: kept
    held.release()


# -- what a killed process or someone else left in the cache


def test_a_view_without_its_ready_marker_is_never_used(root: Path) -> None:
    m = manifest(FILES)
    stale = root / "views" / m.digest
    (stale / "sub").mkdir(parents=True)
    (stale / "a.txt").write_bytes(b"half")
    (stale / "junk").write_bytes(b"junk")
    stale.chmod(0o555)
    (root / ".tmp").mkdir()
    dead = root / ".tmp" / f"{m.files[0].key.replace(':', '.')}~dead"  # its lock is free
    dead.write_bytes(b"partial")
    unknown_old, unknown_new = root / ".tmp" / "old", root / ".tmp" / "new"
    unknown_old.write_bytes(b"")
    unknown_new.write_bytes(b"")
    os.utime(unknown_old, (time.time() - 7200, time.time() - 7200))
    source = Source(FILES)
    with DataCache(root).stage(m, source) as staged:
        assert tree(staged.path) == FILES
    assert sorted(source.fetched) == sorted(FILES)
    assert sorted(p.name for p in (root / ".tmp").iterdir()) == ["new"]

    # a half-removed one (its marker gone first) is rebuilt, from the objects still there
    (root / ".ready" / m.digest).unlink()
    with DataCache(root).stage(m, refuse) as staged:
        assert tree(staged.path) == FILES and staged.reused == len(FILES)


def test_symlinks_planted_in_the_cache_are_not_followed(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    bait = outside / "bait"
    bait.write_bytes(b"EVIL!")
    files = {"d/f": b"hello", "g": b"other bytes"}
    m = manifest(files)
    DataCache(root).stage(manifest({"x": b"x"}), Source({"x": b"x"})).release()  # the layout
    # the object itself: a symlink to a file of the right size
    target = obj(root, b"hello")
    target.parent.mkdir(parents=True)
    target.symlink_to(bait)
    # a shard directory: a symlink to a directory outside
    shard = obj(root, b"other bytes").parent
    shard.symlink_to(outside, target_is_directory=True)
    # the view: a symlink to a directory outside, with its marker
    (root / "views" / m.digest).symlink_to(outside, target_is_directory=True)
    (root / ".ready" / m.digest).touch()

    source = Source(files)
    with DataCache(root).stage(m, source) as staged:
        assert tree(staged.path) == files
        assert not staged.path.is_symlink() and not shard.is_symlink()
        assert not target.is_symlink() and target.read_bytes() == b"hello"
    assert sorted(source.fetched) == sorted(files)
    assert sorted(p.name for p in outside.iterdir()) == ["bait"] and bait.read_bytes() == b"EVIL!"


@pytest.mark.parametrize(
    ("swap", "says"),
    [
        ("d", "refused, 'd' in its view is not a directory"),  # before it is opened
        ("d/e", "dataset version"),  # after: its descriptor names the removed directory
    ],
)
def test_a_directory_swapped_for_a_symlink_in_a_view_being_built_leads_nowhere(
    root: Path, tmp_path: Path, swap: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    files = {"a": b"first", "d/e/f": b"hello"}
    link = datacache.link

    def plant(obj: Path, where: int, name: str) -> None:  # someone swaps a view's directory
        built = next((root / ".tmp").glob("view.*"))
        if (name, swap) in (("a", "d"), ("f", "d/e")):
            if (built / swap).exists():
                (built / swap).rmdir()
            (built / swap).symlink_to(outside, target_is_directory=True)
        link(obj, where, name)

    monkeypatch.setattr(datacache, "link", plant)  # as the view is built, objects fetched
    with pytest.raises(StagingError) as info:
        DataCache(root).stage(manifest(files), lambda e: io.BytesIO(files[e.path]))
    assert says in str(info.value)
    assert list(outside.iterdir()) == [] and list((root / "views").iterdir()) == []
    assert list((root / ".tmp").iterdir()) == []


def test_a_staged_version_held_is_in_use_until_released(root: Path) -> None:
    cache = DataCache(root)
    held = stage(cache, {"f": b"bytes"})
    again = stage(cache, {"f": b"bytes"})
    held.release()
    assert [v.in_use for v in cache.usage()] == [True]  # the second one still holds it
    assert cache.prune(0) == []
    again.release()
    again.release()  # twice: nothing
    assert [v.in_use for v in cache.usage()] == [False]
    assert len(cache.prune(0)) == 1


def test_the_limit_is_a_number_of_bytes(root: Path) -> None:
    with pytest.raises(ValueError, match="0 \\(none\\)"):
        DataCache(root, -1)
    assert DataCache(root).usage() == [] and DataCache(root).total_bytes() == 0
