"""The client's base: the server's URL, the HTTP connection (with the token and the headers
writes need), the JSON calls, and posting a packed spec. Each noun's calls are a class on top
of it (:mod:`~trainhouse.client.logs`, :mod:`~trainhouse.client.checkpoints`, ...), and
:class:`trainhouse.client.Client` is all of them.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import httpx

from trainhouse.client.credentials import current_user, find_token
from trainhouse.core.errors import ClientError
from trainhouse.core.wire import CLIENT_HEADERS, send

if TYPE_CHECKING:
    from trainhouse.core.spec import JobSpec
    from trainhouse.jobfs.workdir import PackedWorkdir

__all__ = ["DEFAULT_URL", "ClientBase", "default_url"]

DEFAULT_URL = "http://127.0.0.1:8470"


def default_url() -> str:
    return os.environ.get("TRAINHOUSE_URL") or DEFAULT_URL


def _plain_http_transport(url: str) -> httpx.HTTPTransport | None:
    """For an ``http://`` server, a transport whose TLS context trusts no certificate at all:
    it never speaks TLS (every request goes to ``url``), and building it skips loading the CA
    bundle, about 30 ms of every command's start. An ``https://`` server gets httpx's default
    (None); proxies from the environment keep theirs either way."""
    if not url.startswith("http://"):
        return None
    return httpx.HTTPTransport(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))


class ClientBase:
    """The connection to one server; the calls themselves are in the classes built on it."""

    def __init__(
        self, url: str | None = None, *, token: str | None = None, timeout: float = 60.0
    ) -> None:
        self.url = (url or default_url()).rstrip("/")
        self.token = token or find_token(self.url)
        headers = dict(CLIENT_HEADERS)  # writes need it (trainhouse.server.origin)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(
            base_url=f"{self.url}/api/v1",
            timeout=timeout,
            headers=headers,
            transport=_plain_http_transport(self.url),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return send(self._http, self.url, method, path, **kwargs)

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._request(method, path, **kwargs)
        try:
            return resp.json()
        except ValueError:
            raise ClientError(
                f"{self.url} did not answer with JSON; is it a trainhouse server (TRAINHOUSE_URL)?",
                status=resp.status_code or 502,
                code="not_trainhouse",
            ) from None

    def _post_packed(self, spec: JobSpec, packed: PackedWorkdir, owner: str | None, to: str) -> Any:
        """POST a spec and its packed workdir to ``to`` (``/jobs`` or ``/searches``): what was
        made, as the server answered."""
        return self._json(
            "POST",
            to,
            data={
                "spec": spec.model_dump_json(exclude={"workdir"}),
                "owner": owner or current_user(),
            },
            files={"workdir": ("workdir.tar.gz", packed.data, "application/gzip")},
        )


def load_and_pack(
    spec_file: str | Path, overrides: list[str] | None
) -> tuple[JobSpec, PackedWorkdir]:
    """The spec file (with its overrides) validated, and its workdir packed."""
    from trainhouse.core.spec import load_spec
    from trainhouse.jobfs.workdir import pack

    spec_path = Path(spec_file)
    spec = load_spec(spec_path, overrides)
    return spec, pack((spec_path.parent / spec.workdir).resolve())
