"""The Ray cluster's autoscaler as the Ray executor uses it: the node types it can launch,
the requests for the waiting jobs' nodes, and the nodes that joined and left.

**Node types.** Read from Ray itself, in this order: the cluster config an autoscaler reports
to the GCS (``ray._private.state.state.get_cluster_config()``: each node group's resources and
``max_count``); else the autoscaling config the head's autoscaler (its ``monitor.py``) was
started with, found by its command line (``--autoscaling-config=FILE``, ``--gcs-address`` at
the cluster's GCS port), when the server runs on the head, as it does under ``ray up``: its
``available_node_types`` (``resources``, ``max_workers``, the cluster's ``max_workers``; the
head's type is left out unless it may launch workers). Ray 2.x's autoscalers do not report the
GCS config themselves, so the file is what a ``ray up`` or ``ray start --head
--autoscaling-config`` cluster is read from. No node type: no autoscaler, and nothing is ever
asked. How many of each type are up comes from the GCS's view of the nodes
(``ray.autoscaler.v2.sdk.get_cluster_status``: each node's ``ray_node_type_name``).

**Requests.** :meth:`Autoscaler.request` sends the scheduler's
:class:`~trainhouse.core.cluster.Wants` with ``ray.autoscaler.sdk.request_resources(bundles=...)``
only when the bundles changed (the first call always sends, clearing what a previous server
asked for), withdraws with an empty request when no job wants a node, and says to each job what
it waits for
(``waiting for 2 nodes of type gpu-8 requested from the autoscaler, 40 s ago``). Unused nodes
go with the autoscaler's own ``idle_timeout_minutes``.

**Node events.** :class:`NodeWatch` compares the live nodes at each read with the last, and
keeps the last :data:`EVENTS` arrivals and departures.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import yaml

from trainhouse.core.cluster import Bundle, NodeType, Want, Wants
from trainhouse.executors.ray.attempt import node_name
from trainhouse.jobfs import jobfiles

log = logging.getLogger(__name__)

TYPES_TTL = 10.0  # seconds one read of the node types serves
STATUS_TTL = 2.0  # seconds one read of which node is of which type serves
EVENTS = 50  # node arrivals and departures kept
REQUESTS = 20  # requests to the autoscaler kept
UNLIMITED = 1_000_000  # a node group's max_count of -1


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{int(seconds) // 10 * 10} s ago"
    return f"{int(seconds // 60)} min ago"


def _nodes_text(count: int) -> str:
    return "1 node" if count == 1 else f"{count} nodes"


# -- node types ----------------------------------------------------------------------------
def types_from_gcs(config: Any) -> tuple[list[NodeType], int | None]:
    """The node groups of the GCS's ``ClusterConfig`` (``autoscaler_pb2``), if any."""
    types = []
    for group in getattr(config, "node_group_configs", None) or []:
        res = dict(group.resources)
        count = int(group.max_count)
        types.append(
            NodeType(
                group.name or f"{res.get('CPU', 0)}cpu-{res.get('GPU', 0)}gpu",
                int(res.get("CPU", 0)),
                int(res.get("GPU", 0)),
                max_workers=UNLIMITED if count < 0 else count,
            )
        )
    return types, None


def types_from_config(config: dict[str, Any]) -> tuple[list[NodeType], int | None]:
    """The worker node types of a Ray cluster YAML (``available_node_types``) and its
    ``max_workers``. A type without ``resources`` cannot be counted on and is left out."""
    cap = config.get("max_workers")
    head = config.get("head_node_type")
    types = []
    for name, spec in (config.get("available_node_types") or {}).items():
        res = (spec or {}).get("resources") or {}
        most = int(spec.get("max_workers", cap if cap is not None else 0) or 0)
        if name == head and not most:
            continue
        if "CPU" not in res:
            log.warning("node type %s names no resources: trainhouse does not ask for it", name)
            continue
        types.append(NodeType(str(name), int(res["CPU"]), int(res.get("GPU", 0)), most))
    return types, int(cap) if cap is not None else None


def monitor_config(gcs_address: str) -> Path | None:
    """The autoscaling config file of the cluster's autoscaler, when it runs on this machine:
    the one whose GCS has ``gcs_address``'s port (the host may be named otherwise: the
    server may reach the head's GCS on 127.0.0.1, its autoscaler on the head's address)."""
    port = gcs_address.rpartition(":")[2]
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error, OSError):
            argv = proc.info["cmdline"] or []
            if not any(a.endswith("monitor.py") for a in argv[:4]):
                continue
            flags = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
            path = flags.get("--autoscaling-config")
            if not path or flags.get("--gcs-address", "").rpartition(":")[2] != port:
                continue
            found = Path(path).expanduser()
            return found if found.is_absolute() else Path(proc.cwd()) / found
    return None


MAX_CONFIG = 1 << 20  # bytes of an autoscaling config read


def read_config(path: Path) -> dict[str, Any]:
    """The YAML of the autoscaling config at ``path``: a regular file of at most
    ``MAX_CONFIG`` bytes, no link followed. The path comes from a process's command line,
    which any process on the machine (a job's too) can make look like Ray's autoscaler: a
    FIFO there must not block the scheduler, nor a link or a huge file be read."""
    data = jobfiles.read_file(path.parent, path, max_size=MAX_CONFIG)
    loaded = yaml.safe_load(data.decode("utf-8"))
    return loaded if isinstance(loaded, dict) else {}


class NodeWatch:
    """Nodes that joined and left between two reads of the live nodes; each event's node type
    as the autoscaler names it, once it does (a node joins before the GCS has its type)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS)
        self._known: dict[str, dict[str, Any]] | None = None
        self._kinds: dict[str, str] = {}  # node id -> node type, of live nodes and events
        self._lock = threading.Lock()

    def observe(self, alive: Iterable[dict[str, Any]], kinds: dict[str, str]) -> None:
        now = self.clock()
        seen = {str(n["NodeID"]): n for n in alive}
        with self._lock:
            self._kinds.update(kinds)
            known, self._known = self._known, seen
            if known is None:
                return  # the first read: what was there is no event
            joined, left = sorted(seen.keys() - known.keys()), sorted(known.keys() - seen.keys())
            for what, ids, raws in (("joined", joined, seen), ("left", left, known)):
                for node_id in ids:
                    raw = raws[node_id]
                    res = raw.get("Resources") or {}
                    self.events.append(
                        {
                            "at": now,
                            "node_id": node_id,
                            "node": node_name(raw),
                            "event": what,
                            "cpus": int(res.get("CPU", 0)),
                            "gpus": int(res.get("GPU", 0)),
                        }
                    )
                    log.info("node %s %s the Ray cluster", node_name(raw), what)
            keep = seen.keys() | {e["node_id"] for e in self.events}
            self._kinds = {k: v for k, v in self._kinds.items() if k in keep}

    def recent(self) -> list[dict[str, Any]]:
        """The events, oldest first (``at``, ``node``, ``event``, ``node_type``, ``cpus``,
        ``gpus``)."""
        with self._lock:
            return [
                {
                    **{k: v for k, v in e.items() if k != "node_id"},
                    "node_type": self._kinds.get(e["node_id"]),
                }
                for e in self.events
            ]


class Autoscaler:
    """What the Ray executor asks of the cluster's autoscaler, and what it has asked."""

    def __init__(self, gcs_address: str, clock: Callable[[], float] = time.time) -> None:
        self.gcs_address = gcs_address
        self.clock = clock
        self.source = ""  # where the node types came from
        self._types: list[NodeType] = []
        self._cap: int | None = None
        self._kinds: dict[str, str] = {}  # node id -> node type name
        self._launching: dict[str, int] = {}
        self._read_at: float | None = None
        self._status_at: float | None = None
        self._sent: str | None = None  # the bundles last sent, as JSON
        self._asked: dict[int, tuple[str, int, float]] = {}  # job -> (type, new nodes, since)
        self._wanted: tuple[Want, ...] = ()  # what was asked for at the last call
        self.requests: deque[dict[str, Any]] = deque(maxlen=REQUESTS)
        self._lock = threading.Lock()

    # -- reading Ray -------------------------------------------------------------------------
    def _read(self) -> None:
        """The node types and the cluster's cap on workers."""
        types: list[NodeType] = []
        cap: int | None = None
        with contextlib.suppress(Exception):
            state: Any = importlib.import_module("ray._private.state")
            types, cap = types_from_gcs(state.state.get_cluster_config())
            self.source = "the cluster config in the GCS"
        if not types:
            path = monitor_config(self.gcs_address)
            if path is not None:
                try:
                    types, cap = types_from_config(read_config(path))
                    self.source = f"{path} (the head's autoscaling config)"
                except (OSError, yaml.YAMLError, TypeError, ValueError) as exc:
                    log.warning("the autoscaling config %s cannot be read: %s", path, exc)
        self._types, self._cap = types, cap
        if not types:
            self.source = ""

    def _read_status(self) -> None:
        """Which node is of which type, and how many of each are being launched."""
        kinds: dict[str, str] = {}
        launching: dict[str, int] = {}
        if self._types:
            try:
                sdk: Any = importlib.import_module("ray.autoscaler.v2.sdk")
                status = sdk.get_cluster_status(self.gcs_address, timeout=5)
                for n in [*status.active_nodes, *status.idle_nodes]:
                    kinds[str(n.node_id)] = str(n.ray_node_type_name)
                for p in status.pending_launches:
                    launching[p.ray_node_type_name] = launching.get(p.ray_node_type_name, 0) + int(
                        p.count
                    )
            except Exception as exc:
                log.debug("the cluster status cannot be read: %s", exc)
            if not launching:  # autoscaler v1 tells it in its status in the GCS's store
                with contextlib.suppress(Exception):
                    kv: Any = importlib.import_module("ray.experimental.internal_kv")
                    consts: Any = importlib.import_module("ray._private.ray_constants")
                    raw = kv._internal_kv_get(consts.DEBUG_AUTOSCALING_STATUS)
                    report = json.loads(raw or b"{}").get("autoscaler_report") or {}
                    for kind, count in (report.get("pending_launches") or {}).items():
                        launching[str(kind)] = int(count)
        self._kinds, self._launching = kinds, launching

    def launchable(self, alive: list[dict[str, Any]]) -> tuple[list[NodeType], int | None]:
        """The node types the autoscaler can launch (each with how many are up now) and the
        cluster's cap on workers; none without an autoscaler."""
        with self._lock:
            now = self.clock()
            if self._read_at is None or now - self._read_at > TYPES_TTL:
                self._read_at = now
                self._read()
            if self._status_at is None or now - self._status_at > STATUS_TTL:
                self._status_at = now
                self._read_status()
            ids = {str(n["NodeID"]) for n in alive}
            up: dict[str, int] = {}
            for node_id, kind in self._kinds.items():
                if node_id in ids:
                    up[kind] = up.get(kind, 0) + 1
            types = [
                NodeType(t.name, t.cpus, t.gpus, t.max_workers, up.get(t.name, 0))
                for t in self._types
            ]
            return types, self._cap

    def kinds(self) -> dict[str, str]:
        with self._lock:
            return dict(self._kinds)

    # -- asking --------------------------------------------------------------------------------
    def request(self, wants: Wants) -> dict[int, str]:
        """Send the request if it changed; each waiting job's note (what it waits for)."""
        wants = wants.keeping(self._wanted)
        self._wanted = wants.jobs
        bundles: list[Bundle] = wants.bundles()
        sent = json.dumps(bundles, sort_keys=True)
        now = self.clock()
        with self._lock:
            if not self._types:
                return {}  # no autoscaler: nothing is ever asked
            if sent != self._sent:
                sdk: Any = importlib.import_module("ray.autoscaler.sdk")
                sdk.request_resources(bundles=bundles)
                if self._sent is not None or bundles:
                    self.requests.append(
                        {"at": now, "bundles": bundles, "jobs": [w.job for w in wants.jobs]}
                    )
                self._sent = sent
                jobs = ", ".join(str(w.job) for w in wants.jobs)
                unmet = "".join(f"; job {j}: {why}" for j, why in wants.unmet.items())
                log.info(
                    "asked the autoscaler for %s%s",
                    f"{bundles} for job(s) {jobs}" if bundles else "nothing (withdrawn)",
                    unmet,
                )
            asked: dict[int, tuple[str, int, float]] = {}
            for w in wants.jobs:
                before = self._asked.get(w.job)
                same = before is not None and before[:2] == (w.node_type, w.nodes)
                asked[w.job] = (w.node_type, w.nodes, before[2] if before and same else now)
            self._asked = asked
        notes = dict(wants.unmet)
        for job, (kind, count, since) in asked.items():
            what = _nodes_text(count) if count else "a node"
            notes[job] = (
                f"waiting for {what} of type {kind} requested from the autoscaler, "
                f"{_ago(now - since)}"
            )
        return notes

    def view(self) -> dict[str, Any] | None:
        """What the cluster page shows of the autoscaler; None without one."""
        with self._lock:
            if not self._types:
                return None
            up: dict[str, int] = {}
            for kind in self._kinds.values():
                up[kind] = up.get(kind, 0) + 1
            types = [
                NodeType(t.name, t.cpus, t.gpus, t.max_workers, up.get(t.name, 0))
                for t in self._types
            ]
            return {
                "source": self.source,
                "node_types": [t.to_dict() for t in types],
                "max_workers": self._cap,
                "launching": dict(self._launching),
                "asked": [
                    {"job": job, "node_type": kind, "nodes": count, "since": since}
                    for job, (kind, count, since) in self._asked.items()
                ],
                "requests": list(self.requests),
            }
