"""Tiny wheels written by hand, and a local package index that serves them over HTTP: what the
environment tests install, offline and deterministic."""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def write_wheel(
    directory: Path, name: str, version: str, requires: Sequence[str] = (), body: str = ""
) -> Path:
    """A pure-Python wheel of the module ``name`` (``VERSION`` in it, then ``body``)."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n{body}",
        f"{dist}/METADATA": metadata,
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    path = directory / f"{module}-{version}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            data = text.encode()
            zf.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{member},sha256={digest.decode()},{len(data)}")
        record.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path


class Index:
    """An HTTP server on 127.0.0.1: ``/links/`` lists the wheels of a directory (a find-links
    page), ``/simple/...`` is an index that has nothing (404). ``hold()`` makes the next
    request for ``/links/`` wait until ``release()``: a build stuck halfway. ``outage(n)``
    answers the next ``n`` requests for ``/links/`` with 503: an index briefly down."""

    def __init__(self, wheels: Path) -> None:
        self.wheels = wheels
        self.held = threading.Event()  # a request is being held
        self._release = threading.Event()
        self._release.set()
        self.requests: list[str] = []
        self.failing = 0  # requests for /links/ still answered 503
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(wheels), **kwargs)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                index.requests.append(self.path)
                if not self.path.startswith("/links/"):
                    self.send_error(404)
                    return
                if index.failing > 0:
                    index.failing -= 1
                    self.send_error(503)
                    return
                if not index._release.is_set():
                    index.held.set()
                    index._release.wait(60)
                self.path = self.path.removeprefix("/links")
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def links(self) -> str:
        return f"http://127.0.0.1:{self.port}/links/"

    def hold(self) -> None:
        self.held.clear()
        self._release.clear()

    def release(self) -> None:
        self._release.set()

    def outage(self, requests: int) -> None:
        self.failing = requests


@contextmanager
def serving(wheels: Path) -> Iterator[Index]:
    index = Index(wheels)
    index.thread.start()
    try:
        yield index
    finally:
        index.release()
        index.httpd.shutdown()
        index.httpd.server_close()
