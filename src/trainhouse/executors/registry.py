"""The executors a server can run, in one table: ``--executor NAME`` picks an entry.

Adding an executor is a module implementing :class:`~trainhouse.executors.base.Executor` and one
entry here; the server's settings (:class:`ExecutorOptions`) carry its options, checked by the
entry's ``check`` before the server starts and used by its ``build`` when it does. Standard
library only at import: the CLI lists the entries in ``trainhouse server --help`` without
loading an executor.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from trainhouse.executors.base import Executor

__all__ = ["EXECUTORS", "ExecutorEntry", "ExecutorOptions", "build", "check"]

log = logging.getLogger(__name__)


class ExecutorOptions(Protocol):
    """What the executors read of the server's settings."""

    @property
    def home(self) -> Path: ...
    @property
    def executor(self) -> str: ...
    @property
    def cpus(self) -> int | None: ...
    @property
    def gpus(self) -> str | None: ...
    @property
    def ray_address(self) -> str | None: ...
    @property
    def ray_placement_timeout(self) -> float: ...
    @property
    def ray_node_dir(self) -> str | None: ...
    @property
    def shared_checkpoints(self) -> bool: ...


@dataclass(frozen=True)
class ExecutorEntry:
    name: str
    summary: str  # for --help
    build: Callable[[ExecutorOptions], Executor]
    #: raises ValueError when the options cannot work (before the server starts)
    check: Callable[[ExecutorOptions], None]


def _check_local(options: ExecutorOptions) -> None:
    from trainhouse.executors.inventory import parse_gpus, server_mask

    if options.gpus is not None:
        parse_gpus(options.gpus, server_mask())
    if options.cpus is not None and options.cpus < 1:
        raise ValueError(f"--cpus must be >= 1, got {options.cpus}")


def _build_local(options: ExecutorOptions) -> Executor:
    from trainhouse.executors.inventory import local_node
    from trainhouse.executors.local import LocalExecutor

    return LocalExecutor(local_node(options.cpus, options.gpus), options.home)


def _check_ray(options: ExecutorOptions) -> None:
    if not options.ray_address:
        raise ValueError(
            "--executor ray needs --ray-address HOST:PORT (the address `ray start --head` "
            "printed); trainhouse never guesses a cluster"
        )
    if importlib.util.find_spec("ray") is None:
        raise ValueError(
            "--executor ray needs Ray in this environment: pip install 'trainhouse[ray]'"
        )
    if options.ray_placement_timeout < 1:
        raise ValueError(
            f"--ray-placement-timeout must be >= 1 s, got {options.ray_placement_timeout:g}"
        )


def _build_ray(options: ExecutorOptions) -> Executor:
    from trainhouse.executors.ray.executor import RayExecutor

    if not options.shared_checkpoints:
        log.warning(
            "checkpoints are on this machine's disk (HOME/jobs/<id>/checkpoints): jobs on "
            "other Ray nodes cannot share them; multi-node jobs are refused until the "
            "server runs with --checkpoint-url or --shared-home"
        )
    return RayExecutor(
        options.ray_address or "",
        options.home,
        placement_timeout=options.ray_placement_timeout,
        node_dir=options.ray_node_dir,
    )


EXECUTORS: dict[str, ExecutorEntry] = {
    "local": ExecutorEntry("local", "this machine", _build_local, _check_local),
    "ray": ExecutorEntry("ray", "a Ray cluster", _build_ray, _check_ray),
}


def entry(name: str) -> ExecutorEntry:
    try:
        return EXECUTORS[name]
    except KeyError:
        names = " or ".join(repr(n) for n in EXECUTORS)
        raise ValueError(f"--executor must be {names}, got {name!r}") from None


def check(options: ExecutorOptions) -> None:
    """Raise ValueError if the executor ``options.executor`` names cannot run with them."""
    entry(options.executor).check(options)


def build(options: ExecutorOptions) -> Executor:
    """The executor ``options.executor`` names, built from the options."""
    return entry(options.executor).build(options)
