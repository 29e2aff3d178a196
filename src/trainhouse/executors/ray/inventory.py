"""What the Ray executor offers the scheduler: the cluster's live nodes, each with what Ray says
is free there plus what trainhouse's own placement groups hold (the scheduler subtracts its
running jobs itself).

One read of Ray's nodes serves the calls of :data:`NODES_TTL` seconds; a lost node or an ended
attempt drops it. Ray's view of free resources lags a removed group by a report of each raylet
(about 0.1 s): :meth:`Inventory.await_release` waits for it, so that the pass that places an
ended attempt's next one sees what the ended one held (an elastic job would start smaller on a
stale view, and grow again later)."""

from __future__ import annotations

import importlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from trainhouse.core.cluster import Node
from trainhouse.core.errors import RayUnavailable
from trainhouse.executors.ray.attempt import Attempt, node_name, to_node

log = logging.getLogger(__name__)

NODES_TTL = 1.0  # seconds one read of Ray's nodes serves nodes() calls
RELEASE_TIMEOUT = 2.0  # seconds a removed group's resources get to show as free in Ray's view

Resources = dict[str, dict[str, float]]  # node id -> resource -> amount


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable("the Ray executor needs Ray: pip install 'trainhouse[ray]'") from None
    return ray


def free_per_node() -> Resources:
    """What Ray says is free on each live node (a resource none is left of is left out); {}
    without the private API that says it (then totals are offered)."""
    try:
        state: Any = importlib.import_module("ray._private.state")
        return dict(state.available_resources_per_node())
    except Exception:
        return {}


def held_by(attempts: Iterable[Attempt]) -> Resources:
    """The resources of the attempts' placed bundles on each node they still have."""
    held: Resources = {}
    for att in attempts:
        for m in att.members:
            if m.node_id and m.lost is None and m.index < len(att.bundles):
                slot = held.setdefault(m.node_id, {})
                for key, value in att.bundles[m.index].items():
                    slot[key] = slot.get(key, 0.0) + value
    return held


class Inventory:
    """Ray's nodes for the scheduler; ``held`` says what trainhouse's running attempts hold."""

    def __init__(self, held: Callable[[], Resources]) -> None:
        self._held = held
        self._read: tuple[float, list[dict[str, Any]], Resources] | None = None
        self._lock = threading.Lock()

    def read(self, *, fresh: bool = False) -> tuple[list[dict[str, Any]], Resources]:
        """The live nodes as ``ray.nodes()`` gives them, and what is free on each."""
        with self._lock:
            now = time.monotonic()
            if fresh or self._read is None or now - self._read[0] > NODES_TTL:
                alive = [n for n in ray_module().nodes() if n.get("Alive")]
                self._read = (now, alive, free_per_node())
            return self._read[1], self._read[2]

    def forget(self) -> None:
        """The next call reads Ray again (a node was lost, a group removed)."""
        with self._lock:
            self._read = None

    def capacity(self) -> list[Node]:
        """Every live node with everything it has (what a job could ever get)."""
        raw, _ = self.read()
        return [to_node(n, None) for n in raw]

    def nodes(self) -> list[Node]:
        """Every live node with what is free for trainhouse: Ray's free resources plus what
        trainhouse's own groups hold there (the scheduler subtracts those itself)."""
        raw, free = self.read()
        held = self._held()
        out = []
        for n in raw:
            avail = free.get(n["NodeID"])
            if avail is not None:
                ours = held.get(n["NodeID"], {})
                avail = {k: avail.get(k, 0.0) + ours.get(k, 0.0) for k in ("CPU", "GPU")}
            out.append(to_node(n, avail))
        return out

    def addresses(self, node: str) -> tuple[str, ...]:
        """The address Ray reaches the live node named ``node`` at (its raylet's)."""
        raw, _ = self.read()
        found = (n.get("NodeManagerAddress") for n in raw if node_name(n) == node)
        return tuple(str(a) for a in found if a)

    def server_node(self) -> str:
        """The node the server itself runs on (its resource samples are named after it)."""
        raw, _ = self.read()
        ip = ray_module().util.get_node_ip_address()
        here = [n for n in raw if n.get("NodeManagerAddress") == ip]
        head = [n for n in here if "node:__internal_head__" in (n.get("Resources") or {})]
        chosen = (head or here)[:1]
        return node_name(chosen[0]) if chosen else socket.gethostname()

    def await_release(self, before: Resources, returned: Resources) -> None:
        """Wait (at most :data:`RELEASE_TIMEOUT`) until Ray's free resources show what a
        removed group ``returned`` on top of what was free ``before`` (a node that left needs
        nothing), then drop the cached read."""
        deadline = time.monotonic() + RELEASE_TIMEOUT
        while before and returned:
            now = free_per_node()
            if all(
                node not in now
                or all(
                    now[node].get(key, 0.0) >= before.get(node, {}).get(key, 0.0) + value - 1e-6
                    for key, value in res.items()
                )
                for node, res in returned.items()
            ):
                break
            if time.monotonic() > deadline:
                log.info(
                    "Ray did not show a removed group's resources free within %gs", RELEASE_TIMEOUT
                )
                break
            time.sleep(0.02)
        self.forget()
