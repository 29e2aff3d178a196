"""Job environments, the pure part: what an attempt's supervisor is asked to set up (the
spec's ``environment:`` with the server's index defaults, :class:`Request`), what its digest
covers (:class:`Inputs`), and what the launcher's log says about it (:func:`phase`).

Building one (uv, the node's cache, locks) is :mod:`trainhouse.executors.node.envbuild`; the
cache of one node is :mod:`trainhouse.jobfs.envcache`. Standard library only: the supervisor
imports this module before anything else.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the supervisor imports this module: no pydantic at its start
    from trainhouse.core.spec import Environment

__all__ = [
    "BUILD_FAILED_CODE",
    "DEFAULT_CACHE_SIZE",
    "ENV_VAR",
    "FAILED_LINE",
    "PYTHON_ENV",
    "SETTING_UP",
    "Defaults",
    "Inputs",
    "Request",
    "parse_size",
    "phase",
    "redact",
    "request_for",
]

#: the supervisor's variable that carries the :class:`Request` (JSON); never passed on to ranks
ENV_VAR = "TRAINHOUSE_ENVIRONMENT"
#: the environment's interpreter: ``python`` in an entrypoint (the rank wrapper reads it)
PYTHON_ENV = "TRAINHOUSE_PYTHON"
#: the launcher's exit code when the environment could not be built (EX_CONFIG): never restarted
BUILD_FAILED_CODE = 78
DEFAULT_CACHE_SIZE = 20 * 1024**3
#: never installed into an environment: the server's own are used
BASE_PACKAGES = ("torch", "trainhouse")
MAX_REQUIREMENTS_BYTES = 1024 * 1024  # one requirements file, pyproject.toml or uv.lock
MAX_INCLUDES = 64  # -r and -c files in one environment
#: lines the supervisor prints (and :func:`phase` reads back from the launcher's log)
SETTING_UP = "trainhouse: setting up environment"
READY_LINE = re.compile(r"trainhouse: environment (\w+) ready in ([0-9.]+) s \((built|reused)\)$")
FAILED_LINE = "trainhouse: the environment could not be built"

_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")


def redact(text: str) -> str:
    """``text`` without the credentials of any URL in it (``https://***@host/...``)."""
    return _CREDENTIALS.sub(r"\1***@", text)


@dataclass(frozen=True)
class Request:
    """What the supervisor is asked to set up: the spec's ``environment`` with the server's
    index defaults filled in, and the node's cache."""

    cache: str
    requirements: str | None = None
    pyproject: str | None = None
    packages: list[str] = field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    cache_size: int = DEFAULT_CACHE_SIZE
    job: str = ""  # "<job>.<attempt>": who uses it (listed by ``trainhouse envs list``)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Request:
        data = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def with_cache(self, cache: str | Path) -> Request:
        return Request(**{**asdict(self), "cache": str(cache)})


@dataclass(frozen=True)
class Defaults:
    """The server's side of every environment: its index options (``--env-index-url``, ...),
    used where a spec gives none, and the cache's size (``--env-cache-size``)."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    cache_size: int = DEFAULT_CACHE_SIZE


def request_for(environment: Environment | None, defaults: Defaults, job: str) -> Request | None:
    """What an attempt's supervisor is asked to set up for ``environment`` (None: nothing);
    its cache is the executor's to fill in (:meth:`Request.with_cache`)."""
    if environment is None:
        return None
    return Request(
        cache="",
        requirements=environment.requirements,
        pyproject=environment.pyproject,
        packages=list(environment.packages),
        index_url=environment.index_url or defaults.index_url,
        extra_index_urls=list(
            defaults.extra_index_urls
            if environment.extra_index_urls is None
            else environment.extra_index_urls
        ),
        find_links=list(
            defaults.find_links if environment.find_links is None else environment.find_links
        ),
        cache_size=defaults.cache_size,
        job=job,
    )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``20G``, ``512M``, ``1.5GiB`` or a number of bytes; ValueError otherwise."""
    found = _SIZE.match(text)
    if found is None:
        raise ValueError(f"must be a size such as 20G or 512M, got {text!r}")
    power = " KMGT".index(found.group(2).upper() or " ")
    return int(float(found.group(1)) * 1024**power)


@dataclass(frozen=True)
class Inputs:
    """Everything that changes an environment, normalised; :attr:`digest` is its hash."""

    python: str
    torch: str
    requirements: list[str]
    constraints: list[str]
    lock: str
    index_url: str | None
    extra_index_urls: list[str]
    find_links: list[str]
    find_links_files: list[str]

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]


# -- what the launcher's log says ---------------------------------------------------------------
def phase(launcher_log: str) -> str | None:
    """What an attempt's launcher log (its part for the attempt) says about its environment:
    "setting up environment" until every node that set one up says it is ready ("environment
    built in 3.2 s", the longest; "reused" when no node built it), "environment failed" once
    one failed, None when it has no environment. A Ray node's lines start with ``[node N]``."""
    setting = launcher_log.count(SETTING_UP)
    if not setting:
        return None
    if FAILED_LINE in launcher_log:
        return "environment failed"
    found = [m for line in launcher_log.splitlines() if (m := READY_LINE.search(line))]
    if len(found) < setting:
        return "setting up environment"
    how = "built" if any(m.group(3) == "built" for m in found) else "reused"
    return f"environment {how} in {max(float(m.group(2)) for m in found):.1f} s"
