"""trainhouse.jobfs.jobfiles: what the server opens of a job's files, and what it refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.hostile import Fifos, finishes, socket_file, sparse
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.jobfiles import UnsafeFile


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A job's directory under the trusted anchor ``tmp_path``, with one regular file."""
    (tmp_path / "job" / "logs").mkdir(parents=True)
    (tmp_path / "job" / "logs" / "rank-0.log").write_bytes(b"step 1\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"not the job's")
    return tmp_path


def test_a_regular_file_is_read(root: Path) -> None:
    path = root / "job" / "logs" / "rank-0.log"
    assert jobfiles.read_file(root, path) == b"step 1\n"
    with jobfiles.open_file(root, path) as fh:
        assert fh.read() == b"step 1\n"
    assert jobfiles.is_file(root, path)
    with pytest.raises(ValueError, match="not under"):
        jobfiles.read_file(root / "job", root / "outside" / "secret")


def test_an_anchor_that_is_a_link_is_the_operators_choice(root: Path) -> None:
    (root / "home").symlink_to(root / "job")
    assert jobfiles.read_file(root / "home", root / "home" / "logs" / "rank-0.log") == b"step 1\n"


@pytest.mark.parametrize("where", ["file", "parent", "grandparent"])
def test_no_link_is_followed_below_the_anchor(root: Path, where: str) -> None:
    if where == "file":
        (root / "job" / "logs" / "x.log").symlink_to(root / "outside" / "secret")
        path = root / "job" / "logs" / "x.log"
    elif where == "parent":
        (root / "job" / "linked").symlink_to(root / "outside")
        path = root / "job" / "linked" / "secret"
    else:
        (root / "job" / "linked").symlink_to(root)
        path = root / "job" / "linked" / "outside" / "secret"
    with pytest.raises(UnsafeFile, match="symbolic link"):
        jobfiles.read_file(root, path)
    assert not jobfiles.is_file(root, path)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        jobfiles.open_append(root, path)


def test_a_fifo_is_refused_without_waiting(root: Path, fifos: Fifos) -> None:
    fifo = fifos.make(root / "job" / "logs" / "rank-1.log")
    done, error = finishes(lambda: _error(lambda: jobfiles.read_file(root, fifo)), 5)
    assert done and isinstance(error, UnsafeFile) and "a FIFO" in str(error)
    done, error = finishes(lambda: _error(lambda: jobfiles.open_append(root, fifo)), 5)
    assert done and isinstance(error, UnsafeFile), error  # no reader: ENXIO, not a wait


def _error(call: object) -> BaseException | None:
    try:
        call()  # type: ignore[operator]
    except BaseException as exc:
        return exc
    return None


def test_sockets_directories_and_hard_links_are_refused(root: Path) -> None:
    logs = root / "job" / "logs"
    socket_file(logs / "sock.log")
    with pytest.raises(UnsafeFile, match="not a regular file"):
        jobfiles.read_file(root, logs / "sock.log")
    (logs / "dir.log").mkdir()
    with pytest.raises(UnsafeFile, match="a directory, not a regular file"):
        jobfiles.read_file(root, logs / "dir.log")
    os.link(root / "outside" / "secret", logs / "hard.log")
    with pytest.raises(UnsafeFile, match="2 hard links"):
        jobfiles.read_file(root, logs / "hard.log")
    with pytest.raises(UnsafeFile, match="2 hard links"):
        jobfiles.open_append(root, logs / "hard.log")  # never appends to the other name
    assert (root / "outside" / "secret").read_bytes() == b"not the job's"


def test_a_read_is_capped_before_anything_is_read(root: Path) -> None:
    big = sparse(root / "job" / "big.json", 1 << 40)  # a terabyte of holes
    with pytest.raises(UnsafeFile, match="over the 1048576-byte limit"):
        jobfiles.read_file(root, big)
    (root / "job" / "ten").write_bytes(b"0123456789")
    assert jobfiles.read_file(root, root / "job" / "ten", max_size=10) == b"0123456789"
    with pytest.raises(UnsafeFile, match="over the 9-byte limit"):
        jobfiles.read_file(root, root / "job" / "ten", max_size=9)


def test_listings_and_walks_never_follow_a_link(root: Path) -> None:
    job = root / "job"
    (job / "shards" / "sub").mkdir(parents=True)
    (job / "shards" / "a").write_bytes(b"a")
    (job / "shards" / "sub" / "b").write_bytes(b"bb")
    assert jobfiles.walk(root, job / "shards") == [("a", 1), ("sub/b", 2)]
    with jobfiles.open_dir(root, job) as d:
        assert [name for name, _ in d.entries()] == ["logs", "shards"]
        with pytest.raises(UnsafeFile, match="more than 1 entries"):
            d.entries(limit=1)
    (job / "shards" / "sub" / "c").symlink_to(root / "outside")
    with pytest.raises(UnsafeFile, match="a symbolic link"):
        jobfiles.walk(root, job / "shards")
    (job / "shards" / "sub" / "c").unlink()
    deep = job / "shards" / "/".join("d" * 5)
    deep.mkdir(parents=True)
    with pytest.raises(UnsafeFile, match="nested too deeply"):
        jobfiles.walk(root, job / "shards", depth=3)
    with pytest.raises(UnsafeFile, match="shards holds more than 3 entries"):
        jobfiles.walk(root, job / "shards", limit=3)


def test_a_removal_never_goes_through_a_link(root: Path) -> None:
    job = root / "job"
    (job / "linked").symlink_to(root / "outside")
    with pytest.raises(UnsafeFile, match="symbolic link"):
        jobfiles.remove(root, job / "linked" / "secret")
    jobfiles.remove(root, job / "linked")  # the link goes, not what it names
    assert not (job / "linked").is_symlink() and (root / "outside" / "secret").exists()
    (job / "tree" / "sub").mkdir(parents=True)
    (job / "tree" / "sub" / "out").symlink_to(root / "outside")
    jobfiles.remove(root, job / "tree")  # a tree holding a link: the link goes with it
    assert not (job / "tree").exists() and (root / "outside" / "secret").exists()
    jobfiles.remove(root, job / "missing")  # fine
    jobfiles.remove(root, job / "missing" / "deeper")


def test_a_write_replaces_a_link_and_never_writes_through_it(root: Path, fifos: Fifos) -> None:
    job = root / "job"
    (job / "state.json").symlink_to(root / "outside" / "secret")
    jobfiles.write_file(root, job / "state.json", b"{}")
    assert (job / "state.json").read_bytes() == b"{}" and not (job / "state.json").is_symlink()
    assert (root / "outside" / "secret").read_bytes() == b"not the job's"
    fifo = fifos.make(job / "other.json")
    done, _ = finishes(lambda: jobfiles.write_file(root, fifo, b"{}"), 5)
    assert done and (job / "other.json").read_bytes() == b"{}"
    assert sorted(p.name for p in job.iterdir()) == ["logs", "other.json", "state.json"]
    with jobfiles.open_append(root, job / "logs" / "new.log") as fh:
        fh.write(b"created")
    assert (job / "logs" / "new.log").read_bytes() == b"created"


def test_a_directory_swapped_for_a_fifo_during_a_removal_is_not_opened(
    root: Path, fifos: Fifos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job swaps a directory for a FIFO between the look and the removal: the removal
    neither waits on it nor fails; it unlinks what is there."""
    fifo = fifos.make(root / "job" / "was-a-directory")
    as_seen = os.lstat(root / "job")  # a directory, when the removal looked
    monkeypatch.setattr(jobfiles.Dir, "lstat", lambda self, name: as_seen)
    done, _ = finishes(lambda: jobfiles.remove(root, fifo), 5)
    assert done, "the removal waits on a FIFO"
    assert not os.path.lexists(fifo)
