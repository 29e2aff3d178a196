"""trainhouse.jobfs.storage: one interface over a local directory and fsspec URLs."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from tests.support.s3 import MotoS3, fsspec_io, moto_s3
from trainhouse.errors import CheckpointError
from trainhouse.jobfs.storage import (
    FsspecStorage,
    LocalStorage,
    Storage,
    confine,
    is_temp,
    open_storage,
    temp_pid,
    tree_digest,
)


@pytest.fixture(params=["path", "file-url", "fsspec-file", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    root = tmp_path / "root"
    if request.param == "path":
        yield open_storage(root)
    elif request.param == "file-url":
        yield open_storage(f"file://{root}")
    elif request.param == "fsspec-file":
        yield FsspecStorage(f"file://{root}")
    else:
        url = f"memory://trainhouse-test-{uuid.uuid4().hex}"
        yield open_storage(url)
        fs = fsspec.filesystem("memory")
        if fs.exists(url):
            fs.rm(url, recursive=True)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


__all__ = ["fsspec_io", "moto_s3"]  # the S3 fixtures of tests.support.s3


def test_open_storage_picks_the_implementation(tmp_path: Path) -> None:
    local = open_storage(tmp_path / "a")
    assert isinstance(local, LocalStorage) and local.local_root == tmp_path / "a"
    assert local.url == str(tmp_path / "a")
    url = open_storage(f"file://{tmp_path}/b/")
    assert isinstance(url, LocalStorage) and url.local_root == tmp_path / "b"
    assert url.url == f"file://{tmp_path}/b"
    mem = open_storage("memory://somewhere")
    assert isinstance(mem, FsspecStorage) and mem.local_root is None
    assert mem.url == "memory://somewhere"
    assert open_storage(mem) is mem
    with pytest.raises(CheckpointError, match="local path"):
        open_storage("file://otherhost/x")


@pytest.mark.parametrize(
    ("rel", "norm"),
    [
        ("a", "a"),
        ("a//b/./c/", "a/b/c"),
        ("./x.pt", "x.pt"),
        ("step-1/.metadata", "step-1/.metadata"),
    ],
)
def test_confine_normalises(rel: str, norm: str) -> None:
    assert confine(rel) == norm


@pytest.mark.parametrize(
    "rel", ["", ".", "/etc/passwd", "a/../../b", "..", "a\\b", "a\x00b", "C:x"]
)
def test_confine_refuses_escapes(rel: str) -> None:
    with pytest.raises(CheckpointError):
        confine(rel)


def test_every_method_confines(storage: Storage) -> None:
    for call in (
        lambda: storage.exists("../x"),
        lambda: storage.is_dir("/abs"),
        lambda: storage.size("a/../../x"),
        lambda: storage.digest(".."),
        lambda: storage.delete("../x"),
        lambda: storage.list("../"),
        lambda: storage.open_read("../x"),
        lambda: storage.open_write("../x"),
        lambda: storage.write_text("../x", "hi"),
        lambda: storage.publish("a", "../b"),
        lambda: storage.download("../x", Path("/nonexistent")),
    ):
        with pytest.raises(CheckpointError):
            call()


def test_tree_digest_is_order_independent() -> None:
    entries = [("b", "22", 2), ("a/x", "11", 1)]
    assert tree_digest(entries) == tree_digest(list(reversed(entries)))
    expected = hashlib.sha256(b"a/x 11 1\nb 22 2\n").hexdigest()
    assert tree_digest(entries) == expected
    assert tree_digest([("b", "22", 3), ("a/x", "11", 1)]) != expected


def test_files_round_trip(storage: Storage, tmp_path: Path) -> None:
    assert storage.list() == [] and not storage.exists("x.pt")
    storage.write_text("x.pt.json", '{"a": 1}')
    tmp = storage.temp_name("x.pt")
    assert is_temp(tmp) and temp_pid(tmp) is not None and not is_temp("x.pt")
    with storage.open_write(tmp) as fh:
        fh.write(b"hello ")
        fh.write(b"world")
    assert not storage.exists("x.pt")
    storage.publish(tmp, "x.pt")
    assert not storage.exists(tmp)
    assert storage.exists("x.pt") and not storage.is_dir("x.pt")
    assert storage.size("x.pt") == 11
    assert storage.digest("x.pt") == sha(b"hello world")
    with storage.open_read("x.pt") as fh:
        assert fh.read() == b"hello world"
    assert storage.read_text("x.pt.json") == '{"a": 1}'
    assert storage.list() == ["x.pt", "x.pt.json"]
    local = storage.download("x.pt", tmp_path / "out" / "y.pt")
    assert local.read_bytes() == b"hello world"
    storage.write_bytes("x.pt", b"new")  # replaces
    assert storage.read_bytes("x.pt") == b"new"
    storage.delete("x.pt")
    storage.delete("x.pt")  # missing is fine
    assert storage.list() == ["x.pt.json"]


def test_directories(storage: Storage, tmp_path: Path) -> None:
    tmp = storage.temp_name("step-000000001")
    storage.write_bytes(f"{tmp}/.metadata", b"meta")
    storage.write_bytes(f"{tmp}/__0_0.distcp", b"shard0")
    storage.write_bytes(f"{tmp}/sub/deep", b"d")
    entries = [
        (".metadata", sha(b"meta"), 4),
        ("__0_0.distcp", sha(b"shard0"), 6),
        ("sub/deep", sha(b"d"), 1),
    ]
    assert sorted(storage.tree_entries(tmp)) == entries
    storage.publish(tmp, "step-000000001")
    assert storage.is_dir("step-000000001") and not storage.exists(tmp)
    assert storage.size("step-000000001") == 11
    assert storage.digest("step-000000001") == tree_digest(entries)
    assert storage.list("step-000000001") == [".metadata", "__0_0.distcp", "sub"]
    assert storage.list() == ["step-000000001"]
    out = storage.download("step-000000001", tmp_path / "copy")
    assert (out / "sub" / "deep").read_bytes() == b"d"
    assert (out / ".metadata").read_bytes() == b"meta"

    # publishing over an existing directory replaces it
    tmp2 = storage.temp_name("step-000000001")
    storage.write_bytes(f"{tmp2}/only", b"x")
    storage.publish(tmp2, "step-000000001")
    assert storage.list("step-000000001") == ["only"]
    assert storage.list() == ["step-000000001"]

    storage.delete("step-000000001")
    assert not storage.exists("step-000000001") and storage.list() == []
    with pytest.raises(FileNotFoundError):
        storage.download("step-000000001", tmp_path / "none")


def test_write_is_atomic_on_failure(storage: Storage) -> None:
    class Boom(Exception):
        pass

    tmp = storage.temp_name("a.pt")
    storage.write_bytes("a.pt", b"old")
    with pytest.raises(Boom), storage.open_write(tmp) as fh:
        fh.write(b"partial")
        raise Boom
    storage.delete(tmp)
    assert storage.read_bytes("a.pt") == b"old"
    assert storage.list() == ["a.pt"]


def test_local_details(tmp_path: Path) -> None:
    st = open_storage(tmp_path / "deep" / "root")
    free = st.free_bytes()
    assert free is not None and free > 0  # measured on the nearest existing parent
    assert st.local_path("a/b") == tmp_path / "deep" / "root" / "a" / "b"
    assert st.location("a") == str(tmp_path / "deep" / "root" / "a")
    mem = open_storage("memory://x")
    assert mem.free_bytes() is None and mem.local_path("a") is None
    assert mem.location("a") == "memory:///x/a"


def test_an_object_another_process_wrote_is_seen_on_s3(
    moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's storage lists a job's checkpoints (retention, the end-of-attempt sweep)
    while the job's own process writes new ones: a listing cached by the server's s3fs made a
    new object look missing (its registration refused; a checkpoint lost from the record)."""
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_s3.endpoint_url)  # as the server is told
    bucket = moto_s3.make_bucket("checkpoints")
    storage = open_storage(f"s3://{bucket}/runs/1")
    moto_s3.put(bucket, "runs/1/step-000000001.pt", b"one")
    assert storage.list() == ["step-000000001.pt"]
    writer = s3fs.S3FileSystem(
        skip_instance_cache=True, client_kwargs={"endpoint_url": moto_s3.endpoint_url}
    )
    writer.pipe(f"{bucket}/runs/1/step-000000002.pt", b"two")  # the job's process
    assert storage.exists("step-000000002.pt")
    assert storage.size("step-000000002.pt") == 3
    assert storage.list() == ["step-000000001.pt", "step-000000002.pt"]


def test_a_directory_is_published_on_s3(moto_s3: MotoS3) -> None:
    """A sharded checkpoint (a Trainer's ``checkpoint-N/`` copied in) published over S3's real
    protocol: s3fs's recursive move also lists the directory's own pseudo-key, whose copy
    failed (NoSuchKey), so no directory checkpoint could be published to S3."""
    bucket = moto_s3.make_bucket("directories")
    storage = FsspecStorage(
        f"s3://{bucket}/runs/1",
        skip_instance_cache=True,
        client_kwargs={"endpoint_url": moto_s3.endpoint_url},
    )
    tmp = storage.temp_name("step-000000004")
    storage.makedirs(tmp)
    storage.write_bytes(f"{tmp}/optimizer.pt", b"optim")
    storage.write_bytes(f"{tmp}/sub/deep", b"d")
    storage.publish(tmp, "step-000000004")
    assert storage.list() == ["step-000000004"]
    assert storage.files("step-000000004") == [("optimizer.pt", 5), ("sub/deep", 1)]
    # publishing over it replaces it
    tmp2 = storage.temp_name("step-000000004")
    storage.write_bytes(f"{tmp2}/only", b"x")
    storage.publish(tmp2, "step-000000004")
    assert storage.files("step-000000004") == [("only", 1)]
    assert storage.list() == ["step-000000004"]


def test_delete_many(storage: Storage) -> None:
    """What retention deletes in a batch: each name as delete removes it, missing ones fine,
    the entries of one directory through one walk to it."""
    for name in ("a.pt", "a.pt.json", "d/b.pt", "d/b.pt.json", "c.pt"):
        storage.write_bytes(name, b"x")
    gone = ["a.pt", "a.pt.json", "d/b.pt", "d/b.pt.json", "never.pt", "nodir/x.pt"]
    assert storage.delete_many(gone) == []
    assert [n for n in ("a.pt", "a.pt.json", "d/b.pt", "d/b.pt.json") if storage.exists(n)] == []
    assert storage.exists("c.pt")
    with pytest.raises(CheckpointError):
        storage.delete_many(["../x"])


def test_delete_many_deletes_nothing_through_a_link(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    storage = open_storage(root)
    storage.write_bytes("kept.pt", b"x")
    elsewhere.mkdir()
    (elsewhere / "f.pt").write_bytes(b"not the job's")
    (root / "linked").symlink_to(elsewhere)
    failed = storage.delete_many(["linked/f.pt", "kept.pt"])
    assert [name for name, _ in failed] == ["linked/f.pt"]
    assert "link" in str(failed[0][1])
    assert (elsewhere / "f.pt").exists() and not storage.exists("kept.pt")
