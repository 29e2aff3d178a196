"""What a request gives for a dataset source, checked before anything is read: the URL (its
protocol, its host, a local path's real location) and its storage options; and the HTTP client
that keeps checking while the server reads an http(s) source (every redirect hop, every DNS
answer).

A member must not make the server read its own files (``file:///etc``: a local source lies under
one of the server's ``--dataset-root`` directories) or its own network (the cloud metadata
endpoint: an http(s) source or an S3 ``endpoint_url`` that resolves to a loopback, link-local,
private or reserved address is refused unless the server allows private sources), nor hand the
server credentials (storage options are an allowlist per protocol; credentials come from the
environment). Standard library at import time; aiohttp for the guarded client.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from trainhouse.core.errors import DatasetError

__all__ = [
    "MAX_URL",
    "OPTIONS",
    "PROTOCOLS",
    "check_host",
    "check_options",
    "check_source",
    "guarded_client",
    "local_path",
    "option_value",
    "protocol_of",
    "within",
]

PROTOCOLS = ("s3", "gs", "gcs", "az", "abfs", "http", "https", "file", "hdfs")
_S3, _GS, _AZ = {"endpoint_url", "anon", "requester_pays"}, {"endpoint_url"}, {"account_name"}
#: the storage options a protocol takes: none carries or selects a credential
OPTIONS = {"s3": frozenset(_S3), "gs": frozenset(_GS), "gcs": frozenset(_GS),
           "az": frozenset(_AZ), "abfs": frozenset(_AZ)}  # fmt: skip
_BOOLEANS = {"anon", "requester_pays"}
MAX_URL = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CREDENTIALS = "credentials come from the server's environment, never with a request"


def check_source(url: str, *, file_roots: Sequence[Path] = (), allow_private: bool = False) -> str:
    """``url`` checked, as the URL to register (a local path as ``file://`` + its real path).

    :class:`DatasetError` for: a protocol not in :data:`PROTOCOLS`; a control character; a user
    or credentials in the URL; an fsspec chain (``::``); a local path (``file://`` or bare and
    absolute) whose real path (links resolved) is not inside one of ``file_roots``; an
    ``http(s)`` host that resolves to a loopback, link-local, private, reserved or unspecified
    address, unless ``allow_private``."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise DatasetError(f"a dataset source is a URL of 1 to {MAX_URL} characters")
    shown = repr(url[:200])
    protocol = protocol_of(url)
    if _CONTROL.search(url):
        raise DatasetError(f"dataset source {shown} holds a control character")
    if protocol not in PROTOCOLS:
        known = ", ".join(PROTOCOLS)
        raise DatasetError(f"dataset source {shown}: {protocol!r} is not one of {known}")
    if "::" in url:
        raise DatasetError(f"dataset source {shown}: fsspec chains ('::') are refused")
    if "@" in urlsplit(url).netloc:
        raise DatasetError(f"dataset source {shown} names a user or credentials: {_CREDENTIALS}")
    if protocol == "file":
        real = os.path.realpath(local_path(url))
        if not within(real, file_roots):
            roots = ", ".join(map(str, file_roots)) or "none: local sources are off"
            raise DatasetError(
                f"dataset source {shown} is {real!r}, outside the dataset roots ({roots})"
            )
        return "file://" + quote(real)
    if protocol in ("http", "https"):
        check_host(url, allow_private, "dataset source")
    return url


def check_options(
    url: str, storage_options: Mapping[str, str], *, allow_private: bool = False
) -> dict[str, str]:
    """``storage_options`` for ``url``, checked: only the keys :data:`OPTIONS` has for its
    protocol (no key, secret, token or profile), short strings, booleans as ``true``/``false``,
    and an ``endpoint_url`` held to the address rule of an HTTP source."""
    allowed = OPTIONS.get(protocol_of(url), frozenset())
    for key, value in storage_options.items():
        if key not in allowed:
            accepted = ", ".join(sorted(allowed)) or "none"
            raise DatasetError(
                f"storage option {str(key)[:40]!r} is not one of a {protocol_of(url)} source's "
                f"({accepted}): {_CREDENTIALS}"
            )
        if not isinstance(value, str) or len(value) > MAX_URL or _CONTROL.search(value):
            raise DatasetError(f"storage option {key!r}: the value must be a short string")
        option_value(key, value)
        if key == "endpoint_url":
            check_host(value, allow_private, "endpoint_url")
    return dict(storage_options)


def protocol_of(url: str) -> str:
    """A URL's protocol; a bare path's is ``file``."""
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def option_value(key: str, value: str) -> object:
    if key not in _BOOLEANS:
        return value
    if value.lower() not in ("true", "false", "1", "0"):
        raise DatasetError(f"storage option {key!r} is true or false, not {value[:40]!r}")
    return value.lower() in ("true", "1")


def local_path(url: str) -> str:
    if "://" in url:
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise DatasetError(f"a file:// source names a local path only, not {url[:200]!r}")
        url = unquote(parts.path)
    if not os.path.isabs(url):
        raise DatasetError(f"a local dataset source is an absolute path, not {url[:200]!r}")
    return url


def within(real: str, roots: Sequence[Path]) -> bool:
    tops = [os.path.realpath(root).rstrip("/") for root in roots]
    return any(real == top or real.startswith(top + "/") for top in tops)


def check_host(url: str, allow_private: bool, what: str) -> None:
    parts = urlsplit(url)
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise DatasetError(f"{what} {url[:200]!r}: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not host:
        raise DatasetError(f"{what} {url[:200]!r} is not an http(s) URL with a host")
    if allow_private:
        return
    try:
        found = socket.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise DatasetError(f"{what} {url[:200]!r}: {host!r} does not resolve ({exc})") from None
    for *_, address in found:
        _refuse_private(host, str(address[0]))


def _refuse_private(host: str, address: str) -> None:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not ip.is_global or ip.is_multicast:
        raise DatasetError(
            f"host {host!r} is {ip}, a loopback, link-local, private or reserved address: the "
            "server reads no address of its own network unless it allows private sources"
        )


async def guarded_client(**kwargs: Any) -> Any:
    """fsspec's ``get_client``: an aiohttp session that refuses private addresses at every
    request of a redirect chain: names in its resolver, literal addresses in a middleware."""
    import aiohttp

    class Resolver(aiohttp.ThreadedResolver):
        async def resolve(self, host: str, port: int = 0, family: Any = socket.AF_INET) -> Any:
            found = await super().resolve(host, port, family)
            for item in found:
                _refuse_private(host, item["host"])
            return found

    async def literal_hosts(request: Any, handler: Any) -> Any:
        with contextlib.suppress(ValueError):  # only an address parses: names are resolved
            _refuse_private(request.url.host or "", request.url.host or "")
        return await handler(request)

    connector = aiohttp.TCPConnector(resolver=Resolver())
    return aiohttp.ClientSession(connector=connector, middlewares=(literal_hosts,), **kwargs)
