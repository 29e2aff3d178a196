"""Who may reach the server from a browser: a pure ASGI middleware that checks the ``Host``
header of every request and where every write comes from, before the app sees either.

**Host.** A request whose ``Host`` header names a host this server does not answer to gets
**400** ``unknown_host``. This stops DNS rebinding: a page on ``attacker.example`` whose name the
attacker then points at 127.0.0.1 talks to the server as its own origin (so it could read the
answers), but its requests say ``Host: attacker.example``. The names the server answers to are
:attr:`Settings.host_names <trainhouse.usecases.settings.Settings.host_names>`: the address it
listens on, ``localhost``, 127.0.0.1 and ::1 when it listens on the loopback (or on every
address), the host of ``--advertise-url`` and each ``--allowed-host``. On every address
(``0.0.0.0``, ``::``) any IP address is taken too: an address names the machine itself, and no
DNS rebinding can make a browser send one for a page of another site.

**Writes.** A request of any method but GET, HEAD and OPTIONS gets **403** ``cross_origin``
unless it carries ``X-Trainhouse-Request: 1`` or shows that it comes from this server's own
pages. A page of another origin can send a "simple" request (a form post, or a ``fetch`` in
``no-cors`` mode, multipart bodies included) without asking the server first, and its answer
goes unread, but what it changes is changed; with auth off on 127.0.0.1 that is a job
submitted, code run as the server's user. A custom header makes a request non-simple: the
browser must first ask the server's permission (a CORS preflight), which this server never
grants, so its presence proves the request is not a cross-origin one from a browser. The CLI,
the Python client, the SDK and the dashboard always send it. Without it, a request passes only
if the browser says where it comes from and that is here: ``Sec-Fetch-Site`` is
``same-origin`` or ``none`` (the user's own navigation), and ``Origin``, where sent, is the
server's own origin (its scheme and ``Host``, or the origin of ``--advertise-url``); from an
older browser, which sends no ``Sec-Fetch-Site``, ``Origin`` must be there and be the server's
own. A request that shows neither is refused: nothing tells it from a forged one.
``Authorization`` and cookies prove nothing: a browser attaches remembered credentials (HTTP
basic auth of a proxy in front, the dashboard's cookie) to cross-site requests by itself.

**MLflow's API** (``/mlflow/...``, :mod:`trainhouse.server.mlflow`) is written by the mlflow
client, which sends no ``X-Trainhouse-Request``. There a write also passes when it carries
``Authorization: Bearer ...`` (a browser never attaches a bearer token by itself, and a page
that sets one makes its request non-simple: the preflight is never granted, so it is never
sent), or when it shows no browser's sign at all: no ``Origin`` and no ``Sec-Fetch-Site``
(every browser in use sends ``Origin`` with a cross-origin POST or PUT, and ``Sec-Fetch-Site``
with every request). A write with another site's ``Origin`` or a cross-site ``Sec-Fetch-Site``
is refused there as everywhere.

**Predictions** (``POST /api/v1/services/NAME/predict``, :mod:`trainhouse.server.predict`) are
sent by inference clients, which carry a token but no ``X-Trainhouse-Request``. One passes when
it carries ``Authorization: Bearer ...`` and shows no browser's sign (no ``Origin``, no
``Sec-Fetch-Site``), or shows this server's own origin; one with another site's ``Origin`` or a
cross-site ``Sec-Fetch-Site`` is refused, token or not. The token itself is checked after this
guard, as on every route. The rest of the API keeps the stricter rule: submitting a job runs
code, and an MLflow write makes at most a tracked run, its metrics and its files.

Both rules hold whether auth is on or off. Requests other than HTTP (the lifespan) pass; the
app has no WebSocket routes. The answers are the API's error shape::

    {"error": {"code": "cross_origin", "message": "POST /api/v1/jobs refused: ..."}}
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from trainhouse.core.wire import CSRF_HEADER
from trainhouse.usecases.settings import Settings

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``Sec-Fetch-Site`` values of a request the server's own pages (or the user) made
OWN_SITES = frozenset({"same-origin", "none"})
_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}
_CSRF_HEADER = CSRF_HEADER.lower().encode()
#: the MLflow API's mount (trainhouse.server.mlflow): writes from non-browser clients pass
MLFLOW_PREFIX = "/mlflow/"
#: predictions (trainhouse.server.predict): a bearer token without a browser's sign passes
PREDICT_PREFIX, PREDICT_SUFFIX = "/api/v1/services/", "/predict"


def host_of(value: str) -> str:
    """The host of a ``Host`` header's value, lower case, without port or IPv6 brackets:
    ``Example.com:8470`` -> ``example.com``, ``[::1]:8470`` -> ``::1``."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value  # a name, or an IPv6 address without brackets (not valid, and not allowed)


def origin_of(scheme: str, authority: str) -> str:
    """``scheme://authority`` as browsers write an ``Origin``: lower case, no default port."""
    scheme = {"ws": "http", "wss": "https"}.get(scheme.lower(), scheme.lower())
    authority = authority.strip().lower()
    port = _DEFAULT_PORTS.get(scheme)
    if port is not None and authority.endswith(f":{port}") and not authority.endswith("]"):
        authority = authority[: -len(port) - 1]
    return f"{scheme}://{authority}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Hosts:
    """The ``Host`` values a server answers to."""

    names: frozenset[str]
    any_address: bool = False  # on every address: any IP address is this machine
    advertised_origin: str | None = None  # the origin of --advertise-url

    @classmethod
    def of(cls, settings: Settings) -> Hosts:
        advertised = None
        if settings.advertise_url:
            parts = urlsplit(settings.advertise_url)
            advertised = origin_of(parts.scheme, parts.netloc.rpartition("@")[2])
        return cls(settings.host_names, settings.listens_everywhere, advertised)

    def allows(self, host: str) -> bool:
        return host in self.names or (self.any_address and _is_ip(host))


class OriginGuard:
    """Refuse requests for hosts the server does not answer to (400) and writes that may come
    from another origin's page (403), as the module's docstring says."""

    def __init__(self, app: ASGIApp, hosts: Hosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope["headers"])
        host_values = headers.get(b"host", [])
        if len(host_values) != 1:
            how = "without a Host header" if not host_values else "with more than one Host header"
            await _refuse(send, 400, "unknown_host", f"refused a request {how}")
            return
        host = host_of(host_values[0])
        if not self.hosts.allows(host):
            await _refuse(
                send,
                400,
                "unknown_host",
                f"this server does not answer to the host {host!r} (the request's Host header): "
                "a page of another site may have pointed that name at it (DNS rebinding). If it "
                f"is a name of this server, start it with --allowed-host {host}",
            )
            return
        method = scope["method"]
        if method not in SAFE_METHODS:
            why = self.foreign(scope, headers, host_values[0])
            if why is not None:
                await _refuse(
                    send,
                    403,
                    "cross_origin",
                    f"{method} {scope['path']} refused: a request that changes something must "
                    f"carry the header {CSRF_HEADER}: 1 (the CLI, the Python client, the SDK "
                    "and the dashboard send it) or come from this server's own pages; "
                    f"this one {why}",
                )
                return
        await self.app(scope, receive, send)

    def foreign(self, scope: Scope, headers: dict[bytes, list[str]], host: str) -> str | None:
        """Why a write may come from another origin's page; None when it cannot."""
        if headers.get(_CSRF_HEADER) == ["1"]:
            return None
        path: str = scope["path"]
        mlflow = path.startswith(MLFLOW_PREFIX)
        bearer = any(a.startswith("Bearer ") for a in headers.get(b"authorization", []))
        if mlflow and bearer:
            return None  # set by a program (a page that sets it must be preflighted: refused)
        own = origin_of(scope.get("scheme", "http"), host)
        origins = headers.get(b"origin", [])
        for origin in origins:
            if origin_of(*origin.partition("://")[::2]) not in (own, self.hosts.advertised_origin):
                return f"came from the page of another origin (Origin: {origin[:200]})"
        sites = headers.get(b"sec-fetch-site", [])
        if sites:
            if all(site.lower() in OWN_SITES for site in sites):
                return None
            return f"came from the page of another origin (Sec-Fetch-Site: {sites[0][:40]})"
        if origins:
            return None  # a browser without Sec-Fetch-Site, on a page of this server
        if mlflow:
            return None  # no browser's sign at all: the mlflow client, curl
        if bearer and path.startswith(PREDICT_PREFIX) and path.endswith(PREDICT_SUFFIX):
            return None  # an inference client with its token (checked by the route's auth)
        return "shows neither (no Origin or Sec-Fetch-Site header)"


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[bytes, list[str]]:
    found: dict[bytes, list[str]] = {}
    for key, value in raw:
        if key in (b"host", b"origin", b"sec-fetch-site", b"authorization", _CSRF_HEADER):
            found.setdefault(key, []).append(value.decode("latin-1"))
    return found


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),  # a body the request may carry is never read
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install(app: FastAPI, settings: Settings) -> None:
    """Add the guard to ``app`` as its outermost middleware: a refused request costs nothing
    else (its body is never read)."""
    app.add_middleware(OriginGuard, hosts=Hosts.of(settings))
