"""An S3-compatible store for tests: moto's server mode on a loopback port, in this process.

:func:`running_moto_s3` (a context manager) and the ``moto_s3`` fixture start
``moto.server.ThreadedMotoServer`` on ``127.0.0.1`` and a free port, with fake credentials in
the environment (``AWS_ACCESS_KEY_ID=testing``, ...: what s3fs and boto3 read), and yield a
:class:`MotoS3`: its ``endpoint_url`` (the storage option s3fs takes), a boto3 client,
``make_bucket``/``put``, and the requests the server answered.

moto counts nothing, so the server's WSGI app is wrapped in a middleware that records each
request's method, bucket and key (path-style addressing, which botocore uses for an endpoint
that is an IP address) before moto sees it: :meth:`MotoS3.gets` is how many times an object's
bytes were asked for. The server answers HTTP/1.0 (one connection per request), so no handler
thread outlives its request on a connection a client keeps alive. moto's state is global to
the process: it is reset when the server starts and when it stops, which always happens.

fsspec's event loop thread (what s3fs runs on) and its loop's default executor (where
aiobotocore makes its SSL context) live as long as the process: the session fixture
``fsspec_io`` starts both before any test's leak check looks at the threads.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import boto3
import pytest
from moto.moto_server.werkzeug_app import MotoRequestHandler
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# AWS_* variables a developer's shell may hold that would point s3fs or boto3 elsewhere
_UNSET = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _OneRequestPerConnection(MotoRequestHandler):
    protocol_version = "HTTP/1.0"  # werkzeug keeps HTTP/1.0 when the class says so

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # no line on stderr per request


@dataclass
class RequestLog:
    """The requests the server answered, as (method, bucket, key): thread-safe."""

    requests: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wrap(self, app: WSGIApp) -> WSGIApp:
        def counting(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            path = unquote(environ.get("PATH_INFO", ""))
            bucket, _, key = path.lstrip("/").partition("/")
            with self.lock:
                self.requests.append((environ["REQUEST_METHOD"], bucket, key))
            return app(environ, start_response)

        return counting

    def counts(self, method: str) -> Counter[tuple[str, str]]:
        with self.lock:
            return Counter((b, k) for m, b, k in self.requests if m == method and k)


class _CountingMotoServer(ThreadedMotoServer):
    """ThreadedMotoServer whose app is wrapped by ``log`` and which closes its socket."""

    def __init__(self, log: RequestLog) -> None:
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self.log = log

    def _server_entry(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        app = self.log.wrap(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(
            self._ip_address, self._port, app, True, request_handler=_OneRequestPerConnection
        )
        self._server_ready_event.set()
        self._server.serve_forever()

    def stop(self) -> None:
        super().stop()
        if self._server is not None:
            self._server.server_close()


@dataclass
class MotoS3:
    """A running moto S3 server: ``endpoint_url``, a boto3 ``client``, and its request log."""

    endpoint_url: str
    client: Any
    log: RequestLog

    @property
    def storage_options(self) -> dict[str, str]:
        """What s3fs needs to reach this server (credentials come from the environment)."""
        return {"endpoint_url": self.endpoint_url}

    def make_bucket(self, name: str) -> str:
        self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, data: bytes, **extra: Any) -> str:
        """Put one object (single-part); returns its ETag, quotes stripped."""
        return str(self.client.put_object(Bucket=bucket, Key=key, Body=data, **extra)["ETag"])[1:-1]

    def put_multipart(self, bucket: str, key: str, parts: list[bytes]) -> str:
        """Put one object in ``parts`` (each but the last at least 5 MiB); returns its ETag."""
        upload = self.client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        done = []
        for number, data in enumerate(parts, 1):
            answer = self.client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=data
            )
            done.append({"ETag": answer["ETag"], "PartNumber": number})
        answer = self.client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done}
        )
        return str(answer["ETag"]).strip('"')

    def gets(self, bucket: str, key: str) -> int:
        """How many GET requests the server answered for the object ``key`` (a ranged read
        counts once per range)."""
        return self.log.counts("GET")[(bucket, key)]

    def get_counts(self) -> Counter[tuple[str, str]]:
        """GET requests per (bucket, key), listings (no key) left out."""
        return self.log.counts("GET")

    def reset(self) -> None:
        """Empty the store (moto's state is the process's) and the request log."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
        with self.log.lock:
            self.log.requests.clear()


@contextlib.contextmanager
def running_moto_s3() -> Iterator[MotoS3]:
    """moto's S3 on 127.0.0.1 and a free port, with fake credentials in the environment, for
    the duration of the block; the server is always stopped and its state reset."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in CREDENTIALS.items():
            env.setenv(name, value)
        for name in _UNSET:
            env.delenv(name, raising=False)
        log = RequestLog()
        server = _CountingMotoServer(log)
        server.start()
        try:
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
            s3 = MotoS3(endpoint, client, log)
            s3.reset()
            try:
                yield s3
            finally:
                with contextlib.suppress(OSError):
                    s3.reset()
                client.close()
        finally:
            server.stop()


@pytest.fixture(scope="session")
def fsspec_io() -> None:
    """fsspec's IO thread and its loop's executor thread, started before the tests' leak
    checks (they live for the process)."""
    import asyncio

    from fsspec.asyn import get_loop, sync

    sync(get_loop(), asyncio.to_thread, lambda: None)


@pytest.fixture
def moto_s3(fsspec_io: None) -> Iterator[MotoS3]:
    """A fresh moto S3 server for one test (see :func:`running_moto_s3`)."""
    with running_moto_s3() as s3:
        yield s3
