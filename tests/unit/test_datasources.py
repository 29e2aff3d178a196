"""trainhouse.jobfs.datasources: listing, hashing and reading dataset sources.

Real parts only: moto's S3 server over HTTP on loopback (s3fs reaches it through the
``endpoint_url`` storage option), a local ``http.server`` origin in a thread, and plain
directories with links and FIFOs in them.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from tests.support import s3
from tests.support.s3 import MotoS3
from trainhouse.core.datasets import FileEntry
from trainhouse.core.errors import DatasetError, StagingError
from trainhouse.jobfs import datasources, sourcecheck
from trainhouse.jobfs.datasources import (
    SourceFile,
    check_options,
    check_source,
    list_source,
    manifest_of,
    manifest_of_tree,
    open_file,
)

MiB = 1 << 20
# the fixtures of tests/support/s3.py, found by pytest under their names here
fsspec_io = s3.fsspec_io
moto_s3 = s3.moto_s3


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- a local HTTP origin ----------------------------------------------------------------------


@dataclass
class Origin:
    """``http.server`` on 127.0.0.1: ``files`` by path; ``/unavailable`` answers 503,
    ``/redirect/HOST/PATH`` redirects to ``http://HOST:<its port>/PATH``."""

    url: str
    files: dict[str, bytes]


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}

    def _answer(self, body: bool) -> None:
        if self.path == "/unavailable":
            self.send_error(503, "try later")
            return
        if self.path.startswith("/redirect/"):
            host, _, path = self.path.removeprefix("/redirect/").partition("/")
            self.send_response(302)
            port = cast(http.server.HTTPServer, self.server).server_port
            self.send_header("Location", f"http://{host}:{port}/{path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = self.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def origin(fsspec_io: None) -> Iterator[Origin]:
    files: dict[str, bytes] = {}
    handler = type("Handler", (_Handler,), {"files": files})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="origin")
    thread.start()
    try:
        yield Origin(f"http://127.0.0.1:{server.server_address[1]}", files)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# -- S3 ---------------------------------------------------------------------------------------


def test_an_s3_prefix_lists_every_object_with_its_etag_as_md5(moto_s3: MotoS3) -> None:
    bucket = moto_s3.make_bucket("data")
    objects = {"train/a.bin": b"a" * 100, "train/sub/b.txt": b"hello", "other/c": b"c"}
    for key, data in objects.items():
        assert moto_s3.put(bucket, key, data) == md5(data)

    files = list_source("s3://data/train", moto_s3.storage_options)

    assert files == [
        SourceFile("a.bin", 100, ("md5", md5(b"a" * 100))),
        SourceFile("sub/b.txt", 5, ("md5", md5(b"hello"))),
    ]
    assert list_source("s3://data/train/sub/b.txt", moto_s3.storage_options) == [
        SourceFile("b.txt", 5, ("md5", md5(b"hello")))
    ]
    assert moto_s3.get_counts() == {}  # listed, never read


def test_a_multipart_or_kms_object_is_hashed_with_sha256_read_once(moto_s3: MotoS3) -> None:
    bucket = moto_s3.make_bucket("data")
    parts = [b"p" * (5 * MiB), b"tail"]
    etag = moto_s3.put_multipart(bucket, "set/big.bin", parts)
    assert "-" in etag
    moto_s3.put(bucket, "set/kms.bin", b"secret", ServerSideEncryption="aws:kms")
    moto_s3.put(bucket, "set/plain.txt", b"plain")
    options = moto_s3.storage_options

    files = {f.path: f for f in list_source("s3://data/set/", options)}
    assert files["big.bin"].checksum is None and files["big.bin"].size == 5 * MiB + 4
    assert files["kms.bin"].checksum is None
    assert files["plain.txt"].checksum == ("md5", md5(b"plain"))

    seen: list[tuple[int, int]] = []
    manifest = manifest_of(
        "s3://data/set", options, allow_private=True, progress=lambda d, t: seen.append((d, t))
    )

    assert manifest.files == (
        FileEntry("big.bin", 5 * MiB + 4, "sha256", sha256(b"".join(parts))),
        FileEntry("kms.bin", 6, "sha256", sha256(b"secret")),
        FileEntry("plain.txt", 5, "md5", md5(b"plain")),
    )
    assert seen[-1] == (5 * MiB + 10, 5 * MiB + 10)
    assert moto_s3.get_counts() == {("data", "set/big.bin"): 1, ("data", "set/kms.bin"): 1}


def test_open_file_streams_an_object(moto_s3: MotoS3) -> None:
    bucket = moto_s3.make_bucket("data")
    data = os.urandom(3 * MiB + 17)
    moto_s3.put(bucket, "set/x/shard-0.bin", data)

    with open_file("s3://data/set", moto_s3.storage_options, "x/shard-0.bin") as fh:
        chunks = list(iter(lambda: fh.read(MiB), b""))

    assert b"".join(chunks) == data and len(chunks) == 4
    with open_file("s3://data/set/x/shard-0.bin", moto_s3.storage_options, "shard-0.bin") as fh:
        assert fh.read() == data


def test_a_missing_object_is_a_staging_error_not_transient(moto_s3: MotoS3) -> None:
    moto_s3.make_bucket("data")
    moto_s3.put("data", "set/a", b"a")

    with (
        pytest.raises(StagingError, match=r"'gone\.bin' .* is missing") as err,
        open_file("s3://data/set", moto_s3.storage_options, "gone.bin"),
    ):
        pass
    assert not err.value.transient
    with pytest.raises(DatasetError, match="no object under this prefix"):
        list_source("s3://data/nothing/", moto_s3.storage_options)


def test_an_s3_key_with_dot_dot_is_refused(moto_s3: MotoS3) -> None:
    moto_s3.make_bucket("data")
    moto_s3.put("data", "set/ok", b"1")
    moto_s3.put("data", "set/../escape", b"2")

    with pytest.raises(DatasetError, match=r"'\.\./escape' cannot be a dataset file"):
        list_source("s3://data/set", moto_s3.storage_options)


def test_more_objects_than_max_files_are_refused(moto_s3: MotoS3) -> None:
    moto_s3.make_bucket("data")
    for i in range(5):
        moto_s3.put("data", f"set/{i}", b"x")

    with pytest.raises(DatasetError, match="more than 3 files"):
        list_source("s3://data/set", moto_s3.storage_options, max_files=3)
    assert len(list_source("s3://data/set", moto_s3.storage_options, max_files=5)) == 5


def test_storage_options_never_carry_credentials_or_reach_private_endpoints(
    moto_s3: MotoS3,
) -> None:
    options = moto_s3.storage_options
    for bad in ({"key": "AKIA..."}, {"secret": "x"}, {"profile": "admin"}):
        with pytest.raises(DatasetError, match="credentials come from the server's environment"):
            check_options("s3://data/set", bad)
    with pytest.raises(DatasetError, match="loopback, link-local, private"):
        manifest_of("s3://data/set", options)
    assert check_options("s3://data/set", options, allow_private=True) == options
    assert check_options("s3://b", {"anon": "true"}) == {"anon": "true"}
    with pytest.raises(DatasetError, match="true or false"):
        check_options("s3://b", {"anon": "maybe"})
    with pytest.raises(DatasetError, match=r"not one of a https source's \(none\)"):
        check_options("https://example.com/x", {"headers": "Authorization: x"})


# -- HTTP -------------------------------------------------------------------------------------


def test_an_http_file_is_hashed_and_streamed(origin: Origin) -> None:
    data = os.urandom(2 * MiB + 3)
    origin.files["/sets/train.tar"] = data
    url = f"{origin.url}/sets/train.tar"

    manifest = manifest_of(url, {}, allow_private=True)

    assert manifest.files == (FileEntry("train.tar", len(data), "sha256", sha256(data)),)
    with open_file(url, {}, "train.tar") as fh:
        assert fh.read(10) == data[:10]
        assert fh.read() == data[10:]


def test_http_errors_map_to_staging_errors(origin: Origin) -> None:
    with (
        pytest.raises(StagingError, match="503") as err,
        open_file(f"{origin.url}/unavailable", {}, "unavailable"),
    ):
        pass
    assert err.value.transient

    with (
        pytest.raises(StagingError, match="is missing") as err,
        open_file(f"{origin.url}/gone.bin", {}, "gone.bin"),
    ):
        pass
    assert not err.value.transient


def test_http_to_a_private_address_needs_allow_private(origin: Origin) -> None:
    origin.files["/f"] = b"data"
    url = f"{origin.url}/f"

    for source in (url, "http://localhost/f", "http://169.254.169.254/latest/meta-data/x"):
        with pytest.raises(DatasetError, match="loopback, link-local, private"):
            check_source(source)
    with pytest.raises(DatasetError, match="loopback, link-local, private"):
        manifest_of(url, {})
    assert check_source(url, allow_private=True) == url
    assert manifest_of(url, {}, allow_private=True).files[0].digest == sha256(b"data")


def test_the_guarded_http_client_checks_every_hop_of_a_redirect(
    origin: Origin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the server reads an HTTP source, what a redirect (or a DNS answer that changed)
    reaches is held to the rule the URL was: here 127.0.0.1 plays a public address, and the
    origin redirects to 127.0.0.2, the private one."""
    refuse = sourcecheck._refuse_private

    def only_127_0_0_2(host: str, address: str) -> None:
        if address == "127.0.0.2":
            refuse(host, address)

    monkeypatch.setattr(sourcecheck, "_refuse_private", only_127_0_0_2)
    origin.files["/f"] = b"data"
    fs, _ = datasources._filesystem(f"{origin.url}/f", {}, guard=True)

    assert fs.info(f"{origin.url}/redirect/127.0.0.1/f")["size"] == 4  # followed
    with pytest.raises(FileNotFoundError) as err:  # fsspec's word for any failed request
        fs.info(f"{origin.url}/redirect/127.0.0.2/f")
    message = str(datasources._error(err.value, "u", False))
    assert "'127.0.0.2' is 127.0.0.2, a loopback, link-local, private" in message


# -- local directories ------------------------------------------------------------------------


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    root = tmp_path / "shared"
    (root / "set" / "sub").mkdir(parents=True)
    (root / "set" / "a.bin").write_bytes(b"a" * 10)
    (root / "set" / "sub" / "b.txt").write_bytes(b"hello")
    return root


def test_a_local_directory_is_listed_hashed_and_read(shared: Path) -> None:
    url = check_source(f"file://{shared}/set", file_roots=[shared])

    assert url == f"file://{shared.resolve()}/set"
    assert list_source(url, {}) == [SourceFile("a.bin", 10), SourceFile("sub/b.txt", 5)]
    manifest = manifest_of(url, {}, file_roots=[shared])
    assert manifest.files == (
        FileEntry("a.bin", 10, "sha256", sha256(b"a" * 10)),
        FileEntry("sub/b.txt", 5, "sha256", sha256(b"hello")),
    )
    assert manifest_of_tree(shared / "set") == manifest
    with open_file(url, {}, "sub/b.txt") as fh:
        assert fh.read() == b"hello"
    single = manifest_of(str(shared / "set" / "a.bin"), {}, file_roots=[shared])
    assert [f.path for f in single.files] == ["a.bin"]


def test_a_local_source_outside_the_roots_is_refused(shared: Path, tmp_path: Path) -> None:
    (tmp_path / "private").mkdir()
    (shared / "escape").symlink_to(tmp_path / "private")

    for url in ("file:///etc", f"file://{tmp_path}/private", f"{shared}/escape", "/etc/passwd"):
        with pytest.raises(DatasetError, match="outside the dataset roots"):
            check_source(url, file_roots=[shared])
    with pytest.raises(DatasetError, match="local sources are off"):
        check_source(f"file://{shared}/set")
    with pytest.raises(DatasetError, match="absolute path"):
        check_source("relative/dir", file_roots=[shared])
    with pytest.raises(DatasetError, match="local path only"):
        check_source(f"file://otherhost{shared}", file_roots=[shared])


def test_links_and_fifos_inside_a_directory_are_refused_by_name(
    shared: Path, tmp_path: Path
) -> None:
    url = f"file://{shared}/set"
    (tmp_path / "outside").write_bytes(b"secret")
    (shared / "set" / "sub" / "link").symlink_to(tmp_path / "outside")

    with pytest.raises(DatasetError, match="'sub/link' is a symbolic link"):
        list_source(url, {})
    with pytest.raises(StagingError, match="symbolic link"), open_file(url, {}, "sub/link"):
        pass
    (shared / "set" / "sub" / "link").unlink()
    os.mkfifo(shared / "set" / "pipe")
    with pytest.raises(DatasetError, match="'pipe' is a FIFO"):
        manifest_of_tree(shared / "set")
    with pytest.raises(StagingError, match="'pipe' is a FIFO"), open_file(url, {}, "pipe"):
        pass
    (shared / "set" / "pipe").unlink()
    (shared / "set" / "linked-dir").symlink_to(shared / "set" / "sub")
    with pytest.raises(StagingError, match="symbolic link"), open_file(url, {}, "linked-dir/b.txt"):
        pass


def test_a_local_directory_over_max_files_is_refused(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"f{i}").write_bytes(b"x")

    with pytest.raises(DatasetError, match="more than 3 files"):
        list_source(f"file://{tmp_path}", {}, max_files=3)


def test_a_file_that_grows_or_shrinks_while_hashed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "set" / "log.txt"
    path.parent.mkdir()
    path.write_bytes(b"x" * 100)

    def append(done: int, total: int) -> None:
        with path.open("ab") as fh:
            fh.write(b"more")

    with pytest.raises(
        DatasetError, match=r"'log\.txt' grew while it was read \(listed at 100 bytes\)"
    ):
        manifest_of_tree(path.parent, progress=append)

    def truncate(done: int, total: int) -> None:
        os.truncate(path, 0)

    path.write_bytes(b"y" * (2 * MiB))
    with pytest.raises(
        DatasetError, match=r"'log\.txt' shrank while it was read \(1048576 of the 2097152 bytes"
    ):
        manifest_of_tree(path.parent, progress=truncate)


# -- URLs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/data", "memory://bucket/x", "sftp://host/x", "zip://x::s3://b/a.zip"],
)
def test_protocols_outside_the_list_are_refused(url: str) -> None:
    with pytest.raises(DatasetError, match="is not one of s3, gs"):
        check_source(url)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("s3://bucket/a\nb", "control character"),
        ("s3://bucket/x::file:///etc", "chains"),
        ("https://user:pw@example.com/f", "credentials"),
        ("s3://key:secret@bucket/x", "credentials"),
        ("", "a URL of 1 to"),
    ],
)
def test_urls_that_break_a_rule_are_refused(url: str, match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        check_source(url)


def test_cloud_urls_pass_unchanged() -> None:
    for url in ("s3://bucket/prefix", "gs://b/p", "az://container/p", "hdfs://nn:8020/d"):
        assert check_source(url) == url
