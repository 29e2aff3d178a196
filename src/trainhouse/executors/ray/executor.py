"""The Ray executor: a job is one placement group on an existing Ray cluster, one bundle per node.

``trainhouse server --executor ray --ray-address HOST:PORT`` makes the server a Ray driver (in
the ``trainhouse`` namespace). Its inventory is the cluster's live nodes, read from Ray at every
scheduling pass (nodes joining and leaving are followed), each offering what Ray says is free
plus what trainhouse's own placement groups hold there; custom resources become the node's
labels.

An attempt placed on N nodes is a detached placement group of N bundles (``STRICT_SPREAD``, or
``STRICT_PACK`` for one node), each bundle pinned to the node the scheduler chose, and one
detached :class:`~trainhouse.executors.ray.node.NodeAgent` actor per bundle, all named after the
server's home, the job and the attempt; an elastic job's N and ranks per node are those of the
attempt's placements (the size it was placed at), not its spec's largest. The actor of bundle
*i* runs torchrun for node rank *i* (static rendezvous at a free port of node 0), so ranks see
the same environment as under the local executor. A group Ray cannot place within
``--ray-placement-timeout`` is removed and the job goes back to the queue with that reason (no
restart is counted).

The server polls every actor without blocking (one outstanding ``status`` call each): the
ranks' log files grow on the nodes' disks and are appended to ``HOME/jobs/<id>/logs`` as they
do (offsets kept in the attempt's ``ray-logs.json``), so logs read exactly as with the local
executor; metrics and checkpoints go from the ranks to the server's URL and the checkpoint
storage as always. An attempt ends when every node's torchrun has ended or its node is lost. A
node whose torchrun failed, or that was lost (its actor died: the node left, the raylet died),
gets the others SIGTERM at once and SIGKILL 5 s later; a lost node's ranks are recorded as
killed (SIGKILL) before any other rank ended, an infrastructure failure. Then every actor
clears its node (nothing survives it: see :mod:`~trainhouse.executors.ray.node`) and the group
is removed. A restarted server finds running attempts again by their names (:meth:`adopt`).

With an autoscaler on the cluster, the scheduler asks it for the nodes waiting jobs lack
(:meth:`launchable`, :meth:`request_capacity`: :mod:`~trainhouse.executors.ray.autoscale`), and
the nodes that join and leave are kept as events (:meth:`cluster_view`).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from trainhouse.core.cluster import Node, NodeType, Wants
from trainhouse.core.errors import RayUnavailable
from trainhouse.core.lifecycle import StopReason
from trainhouse.executors.base import Exit, Launch, ProcessInfo
from trainhouse.executors.node.torchrun import spec_environment
from trainhouse.executors.ray.attempt import (
    Attempt,
    Member,
    bundle,
    first_line,
    node_name,
    pack,
    probe,
    ranks_per_node,
)
from trainhouse.executors.ray.autoscale import Autoscaler, NodeWatch
from trainhouse.executors.ray.inventory import (
    Inventory,
    Resources,
    free_per_node,
    held_by,
    ray_module,
)
from trainhouse.executors.ray.node import NodeAgent, boot_id
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.layout import LAUNCHER_LOG, JobLayout

log = logging.getLogger(__name__)

NAMESPACE = "trainhouse"
PIDS_EVERY = 2.0  # seconds between two process lists of a node (for the resource monitor)
START_TIMEOUT = 120.0  # seconds the actors get to unpack the code and start torchrun
TEARDOWN_TIMEOUT = 10.0
UNRESPONSIVE = 60.0  # seconds a node may stay silent after SIGKILL before it counts as lost


class RayExecutor:
    """Runs every job as a Ray placement group with one torchrun per bundle."""

    name: ClassVar[str] = "ray"
    multi_node: ClassVar[bool] = True

    def __init__(
        self,
        address: str,
        home: Path,
        *,
        placement_timeout: float = 60.0,
        node_dir: str | None = None,
    ) -> None:
        ray = ray_module()
        if not address:
            raise RayUnavailable("the Ray executor needs --ray-address HOST:PORT")
        self.home = home
        self.home_id = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
        self.placement_timeout = placement_timeout
        self.node_dir = node_dir
        probe(address)
        # ray.init makes SIGTERM exit the process at once: keep the server's graceful stop
        on_term = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        except Exception as exc:
            raise RayUnavailable(f"cannot connect to the Ray cluster at {address}: {exc}") from exc
        finally:
            if threading.current_thread() is threading.main_thread() and on_term is not None:
                signal.signal(signal.SIGTERM, on_term)
        self._agent = ray.remote(max_restarts=0, max_task_retries=0)(NodeAgent)
        self._boot_id = boot_id()
        self._attempts: dict[int, Attempt] = {}
        self._lock = threading.RLock()
        self.inventory = Inventory(self._held)
        self._swept = False
        self.autoscaler = Autoscaler(str(ray.get_runtime_context().gcs_address))
        self.watch = NodeWatch()

    # -- names -----------------------------------------------------------------------------
    def group_name(self, job_id: int, attempt: int) -> str:
        return f"th-{self.home_id}-{job_id}-{attempt}"

    def actor_name(self, job_id: int, attempt: int, index: int) -> str:
        return f"{self.group_name(job_id, attempt)}-{index}"

    def marker(self, job_id: int, attempt: int, index: int) -> str:
        return f"{self.home_id}:{job_id}:{attempt}:{index}"

    # -- inventory -------------------------------------------------------------------------
    def _held(self) -> Resources:
        """Resources of trainhouse's placed bundles on each node (node id -> resources)."""
        with self._lock:
            return held_by(self._attempts.values())

    def capacity(self) -> list[Node]:
        """Every live node with everything it has (what a job could ever get)."""
        return self.inventory.capacity()

    def nodes(self) -> list[Node]:
        """Every live node with what is free for trainhouse (:mod:`.inventory`)."""
        return self.inventory.nodes()

    # -- the autoscaler ----------------------------------------------------------------------
    def _observed(self) -> list[dict[str, Any]]:
        """The live nodes, the ones that joined or left since the last call kept as events."""
        alive, _ = self.inventory.read()
        self.watch.observe(alive, self.autoscaler.kinds())
        return alive

    def launchable(self) -> tuple[list[NodeType], int | None]:
        """The node types the cluster's autoscaler can launch and its cap on workers."""
        return self.autoscaler.launchable(self._observed())

    def request_capacity(self, wants: Wants) -> dict[int, str]:
        """Ask the autoscaler for the waiting jobs' nodes; what each job waits for."""
        return self.autoscaler.request(wants)

    def cluster_view(self) -> dict[str, Any]:
        """Nodes that joined and left lately, and what was asked of the autoscaler."""
        self._observed()
        return {"node_events": self.watch.recent(), "autoscaler": self.autoscaler.view()}

    def server_node(self) -> str:
        """The node the server itself runs on (its resource samples are named after it)."""
        return self.inventory.server_node()

    def node_addresses(self, node: str) -> tuple[str, ...]:
        """Ray's address of the live node ``node`` (none once it has left)."""
        return self.inventory.addresses(node)

    # -- launch ----------------------------------------------------------------------------
    def launch(self, launch: Launch) -> ProcessInfo:
        # the size it was placed at: an elastic job's may be below its spec's largest
        att = Attempt(
            launch.job_id,
            launch.attempt,
            launch.layout,
            ranks_per_node(launch.placements),
            [Member(i) for i in range(len(launch.placements))],
        )
        att.bundles = [bundle(p) for p in launch.placements]
        launch.layout.logs.mkdir(parents=True, exist_ok=True)
        att.layout.dir.mkdir(parents=True, exist_ok=True)
        with jobfiles.open_append(launch.layout.home, launch.layout.logs / LAUNCHER_LOG) as fh:
            fh.write(f"=== trainhouse: attempt {launch.attempt} (ray) ===\n".encode())
        att.starter = threading.Thread(
            target=self._start,
            args=(att, launch),
            name=f"trainhouse-ray-start-{launch.job_id}",
            daemon=True,
        )
        with self._lock:
            self._attempts[launch.job_id] = att
        att.starter.start()
        return ProcessInfo(0, time.time())

    def _start(self, att: Attempt, launch: Launch) -> None:
        ray = ray_module()
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        try:
            by_name = {node_name(n): n["NodeID"] for n in self.inventory.read(fresh=True)[0]}
            wanted = [by_name.get(p.node) for p in launch.placements]
            gone = [p.node for p, nid in zip(launch.placements, wanted, strict=True) if not nid]
            if gone:
                att.problem = f"node {', '.join(gone)} left the Ray cluster before the job started"
                att.phase = "unplaced"
                return
            strategy = "STRICT_SPREAD" if len(att.bundles) > 1 else "STRICT_PACK"
            pin: dict[str, Any] = {}  # each bundle on the node the scheduler chose
            if "bundle_label_selector" in inspect.signature(placement_group).parameters:
                pin["bundle_label_selector"] = [{"ray.io/node-id": str(n)} for n in wanted]
            pg = placement_group(
                att.bundles,
                strategy=strategy,
                name=self.group_name(att.job_id, att.number),
                lifetime="detached",
                **pin,
            )
            att.pg = pg
            deadline = time.monotonic() + self.placement_timeout
            ready = pg.ready()
            while True:
                if att.abort.is_set():
                    att.phase = "aborted"
                    return
                with contextlib.suppress(ray.exceptions.GetTimeoutError):
                    ray.get(ready, timeout=0.5)
                    break
                if time.monotonic() > deadline:
                    what = ", ".join(
                        f"{p.node} ({p.cpus} CPU{f', {len(p.gpus)} GPU' if p.gpus else ''})"
                        for p in launch.placements
                    )
                    att.problem = (
                        f"Ray could not place the job's placement group ({strategy}: {what}) "
                        f"within {self.placement_timeout:g} s; back in the queue"
                    )
                    att.phase = "unplaced"
                    return
            placed = placement_group_table(pg).get("bundles_to_node_id", {})
            for m in att.members:
                m.node_id = str(placed.get(m.index, "") or wanted[m.index])
                m.actor = self._agent.options(
                    name=self.actor_name(att.job_id, att.number, m.index),
                    namespace=NAMESPACE,
                    lifetime="detached",
                    num_cpus=att.bundles[m.index]["CPU"],
                    num_gpus=att.bundles[m.index].get("GPU", 0.0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=m.index
                    ),
                ).remote(
                    self.node_dir,
                    self._tag(att, m.index),
                    self._marker(att, m.index),
                    f"{self.home_id}-{att.job_id}",
                )
            archive = ray.put(pack(launch.workdir))
            infos = self._wait(att, [m.actor.prepare.remote(archive) for m in att.members])
            if infos is None:
                return
            for m, info in zip(att.members, infos, strict=True):
                m.boot_id = info["boot_id"]
            master = (str(infos[0]["ip"]), int(infos[0]["port"]))
            env = spec_environment(launch.spec)
            calls = []
            for m, info in zip(att.members, infos, strict=True):
                calls.append(
                    m.actor.start.remote(
                        launch.spec.argv,
                        env,
                        launch.env,
                        info["gpus"],
                        procs=att.procs,
                        nodes=len(att.members),
                        node_rank=m.index,
                        master=master,
                        environment=(launch.environment.to_json() if launch.environment else None),
                        datasets=(launch.datasets.to_json() if launch.datasets else None),
                    )
                )
            if self._wait(att, calls) is None:
                return
            att.save_record()
            att.phase = "running"
            log.info(
                "job %s attempt %s runs on %s",
                att.job_id,
                att.number,
                ", ".join(p.node for p in launch.placements),
            )
        except Exception as exc:
            log.exception("job %s: attempt %s could not start", att.job_id, att.number)
            att.problem = f"could not start on the Ray cluster: {first_line(exc)}"
            att.phase = "broken"

    def _wait(self, att: Attempt, refs: list[Any]) -> list[Any] | None:
        """The results of ``refs``; None (and the attempt aborted) if it is stopped first."""
        ray = ray_module()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if att.abort.is_set():
                att.phase = "aborted"
                return None
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0.5)
            if len(done) == len(refs):
                return list(ray.get(refs))
            if time.monotonic() > deadline:
                raise TimeoutError(f"the node actors did not start within {START_TIMEOUT:g} s")

    def _tag(self, att: Attempt, index: int) -> str:
        return f"{self.home_id}-{att.job_id}-{att.number}-{index}"

    def _marker(self, att: Attempt, index: int) -> str:
        return self.marker(att.job_id, att.number, index)

    # -- adopt -----------------------------------------------------------------------------
    def adopt(self, job_id: int, attempt: int, info: ProcessInfo) -> bool:
        """Find a running attempt again by its names: its placement group and one actor per
        node, all started; False (its leftovers go with :meth:`kill_orphans`) otherwise."""
        ray = ray_module()
        try:
            att = Attempt.load(job_id, attempt, JobLayout(self.home, job_id))
            att.pg = ray.util.get_placement_group(self.group_name(job_id, attempt))
            for m in att.members:
                m.actor = ray.get_actor(
                    self.actor_name(job_id, attempt, m.index), namespace=NAMESPACE
                )
            states = ray.get(
                [m.actor.status.remote(dict(m.offsets)) for m in att.members], timeout=30
            )
        except Exception as exc:
            log.info("job %s: attempt %s cannot be re-attached: %s", job_id, attempt, exc)
            return False
        if not all(s["started"] for s in states):
            return False
        att.phase = "running"
        with self._lock:
            self._attempts[job_id] = att
        log.info("job %s: re-attached attempt %s on the Ray cluster", job_id, attempt)
        return True

    def running(self) -> set[int]:
        with self._lock:
            return set(self._attempts)

    # -- stop ------------------------------------------------------------------------------
    def stop(
        self, job_id: int, *, grace: float, reason: StopReason, terminate: bool = True
    ) -> None:
        """As the local executor's: SIGTERM now and SIGKILL after ``grace``, or (not
        ``terminate``) SIGTERM after ``grace`` and SIGKILL 5 s later, on every node."""
        now = time.monotonic()
        with self._lock:
            att = self._attempts.get(job_id)
            if att is None:
                return
            att.stopping.reason = att.stopping.reason or reason
            if att.phase == "starting":
                att.abort.set()  # it has not started training: nothing to wait for
            if not att.stopping.request(now, grace=grace, reason=reason, terminate=terminate):
                return
        log.info("stopping job %s (%s) within %.0f s", job_id, reason.text, grace)

    def _signal(self, att: Attempt, sig: int) -> None:
        for m in att.members:
            if m.actor is not None and not m.done:
                att.signals.append(m.actor.signal.remote(int(sig)))

    # -- poll ------------------------------------------------------------------------------
    def poll(self) -> list[Exit]:
        if not self._swept:
            self._swept = True
            self._sweep()
        exits = []
        now = time.monotonic()
        with self._lock:
            items = list(self._attempts.values())
        for att in items:
            self._consume(att.signals)
            if att.phase == "starting":
                continue
            if att.phase != "running":
                exits.append(self._not_started(att))
                continue
            self._collect(att)
            if all(m.done for m in att.members):
                exits.append(self._finish(att))
                continue
            for sig in att.stopping.due(now):
                if sig == signal.SIGKILL:
                    log.warning("job %s is still running after SIGTERM: SIGKILL", att.job_id)
                self._signal(att, sig)
        return exits

    def _consume(self, refs: list[Any]) -> None:
        ray = ray_module()
        if not refs:
            return
        done, rest = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in done:
            with contextlib.suppress(Exception):
                ray.get(ref)
        refs[:] = rest

    def _collect(self, att: Attempt) -> None:
        ray = ray_module()
        pending = [m.pending for m in att.members if m.pending is not None]
        ready = set()
        if pending:
            ready = set(ray.wait(pending, num_returns=len(pending), timeout=0)[0])
        now = time.monotonic()
        for m in att.members:
            if m.pending is not None and m.pending in ready:
                ref, m.pending = m.pending, None
                try:
                    failed = att.absorb(m, ray.get(ref))
                    if failed:
                        self._fail_fast(att, failed)
                except ray.exceptions.ActorUnavailableError:
                    continue  # a transient failure: asked again below
                except ray.exceptions.RayError as exc:
                    self._lose(att, m, exc)
            if m.pending is None and not m.done and m.actor is not None:
                want_pids = now - m.pids_at >= PIDS_EVERY
                if want_pids:
                    m.pids_at = now
                m.pending = m.actor.status.remote(dict(m.offsets), want_pids)
                m.asked_at = now
            elif (
                m.pending is not None
                and att.stopping.kill_at is not None
                and now - max(att.stopping.kill_at, m.asked_at) > UNRESPONSIVE
            ):  # killed, and silent since: a node cut off without Ray noticing
                m.pending = None
                self._lose(att, m, TimeoutError(f"no answer for {UNRESPONSIVE:g} s after SIGKILL"))

    def _lose(self, att: Attempt, m: Member, exc: Exception) -> None:
        """A node's actor is gone: say whether its node left the cluster or only the actor
        died, and stop the rest of the gang."""
        why = f"its actor died ({first_line(exc)})"
        with contextlib.suppress(Exception):
            raw = next(n for n in ray_module().nodes() if n["NodeID"] == m.node_id)
            if not raw.get("Alive"):
                why = f"{node_name(raw)} left the Ray cluster"
        m.lost = why
        m.pids = []
        self.inventory.forget()  # the scheduler must not place the restart there
        log.warning("job %s attempt %s: node %s lost: %s", att.job_id, att.number, m.index, why)
        self._fail_fast(att, f"node {m.index} was lost")

    def _fail_fast(self, att: Attempt, why: str) -> None:
        """One node failed: the gang cannot go on, so the others are stopped now."""
        if all(m.done or m.ended is not None for m in att.members):
            return
        log.info("job %s: %s; stopping the other nodes", att.job_id, why)
        with self._lock:
            att.stopping.hasten(time.monotonic())

    # -- ends ------------------------------------------------------------------------------
    def _finish(self, att: Attempt) -> Exit:
        ended = att.result()
        self._forget(att)
        self._teardown(att)
        return ended

    def _not_started(self, att: Attempt) -> Exit:
        if att.starter is not None:
            att.starter.join(timeout=5)
        self._forget(att)
        self._teardown(att)
        if att.phase == "unplaced":
            log.info("job %s: %s", att.job_id, att.problem)
            return Exit(
                att.job_id, att.number, 1, stop_reason=att.stopping.reason, requeue=att.problem
            )
        if att.problem:
            with jobfiles.open_append(att.job.home, att.logs / LAUNCHER_LOG) as fh:
                fh.write(f"trainhouse: {att.problem}\n".encode())
        return Exit(att.job_id, att.number, -int(signal.SIGKILL), {}, att.stopping.reason)

    def _forget(self, att: Attempt) -> None:
        with self._lock:
            if self._attempts.get(att.job_id) is att:
                del self._attempts[att.job_id]

    def _teardown(self, att: Attempt) -> int:
        """Clear every node of the attempt, end its actors, remove its group."""
        ray = ray_module()
        self._consume(att.signals)
        live = [m for m in att.members if m.actor is not None and m.lost is None]
        killed = 0
        if live:
            refs = [m.actor.finish.remote() for m in live]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=TEARDOWN_TIMEOUT)
            for ref in ready:
                with contextlib.suppress(Exception):
                    killed += int(ray.get(ref))
        for m in att.members:
            if m.actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(m.actor, no_restart=True)
        if att.pg is not None:
            returned = held_by([att])
            before = free_per_node() if returned else {}
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(att.pg)
            # what it held is offered at the next pass: Ray's view shows it free first
            self.inventory.await_release(before, returned)
        return killed

    def _sweep(self) -> None:
        """Remove this home's groups and actors that no tracked attempt owns (a previous
        server died between an attempt's end and its teardown)."""
        ray = ray_module()
        prefix = f"th-{self.home_id}-"
        with self._lock:
            ours = {self.group_name(a.job_id, a.number) for a in self._attempts.values()}
        try:
            for name in ray.util.list_named_actors():
                if name.startswith(prefix) and name.rsplit("-", 1)[0] not in ours:
                    with contextlib.suppress(Exception):
                        actor = ray.get_actor(name, namespace=NAMESPACE)
                        ray.get(actor.finish.remote(), timeout=TEARDOWN_TIMEOUT)
                        ray.kill(actor, no_restart=True)
            for pg_id, pg in ray.util.placement_group_table().items():
                name = pg.get("name", "")
                if name.startswith(prefix) and name not in ours and pg.get("state") != "REMOVED":
                    with contextlib.suppress(Exception):
                        ray.util.remove_placement_group(ray.util.get_placement_group(name))
                        log.info("removed the leftover placement group %s (%s)", name, pg_id)
        except Exception:
            log.exception("sweeping leftover Ray actors failed")

    def pids(self, job_id: int) -> list[int]:
        """Processes of the attempt on nodes that are this machine (the monitor reads them
        with psutil here); a remote node's are not visible to it."""
        with self._lock:
            att = self._attempts.get(job_id)
            if att is None:
                return []
            return [p for m in att.members if m.boot_id == self._boot_id for p in m.pids]

    def kill_orphans(self, job_id: int, attempt: int) -> int:
        """End whatever an attempt left on the cluster: its actors (clearing their nodes)
        and its placement group."""
        ray = ray_module()
        att = Attempt(job_id, attempt, JobLayout(self.home, job_id), 1, [])
        nodes = 64  # how many actors to look for: the group knows (a lost node's is gone)
        with contextlib.suppress(Exception):
            att.pg = ray.util.get_placement_group(self.group_name(job_id, attempt))
            nodes = len(ray.util.placement_group_table(att.pg)["bundles"])
        for i in range(nodes):
            with contextlib.suppress(ValueError):
                actor = ray.get_actor(self.actor_name(job_id, attempt, i), namespace=NAMESPACE)
                att.members.append(Member(i, actor=actor))
        return self._teardown(att)

    def shutdown(self, *, grace: float) -> list[Exit]:
        for job_id in self.running():
            self.stop(job_id, grace=grace, reason=StopReason.SHUTDOWN)
        exits: list[Exit] = []
        deadline = time.monotonic() + grace + 15
        while self.running() and time.monotonic() < deadline:
            exits.extend(self.poll())
            time.sleep(0.1)
        with self._lock:
            left = list(self._attempts.values())
        for att in left:  # nodes that never answered: give up on them
            if att.starter is not None:
                att.starter.join(timeout=5)
            for m in att.members:
                if not m.done:
                    m.lost = "no answer while the server shut down"
            exits.append(self._finish(att))
        with contextlib.suppress(Exception):
            ray_module().shutdown()
        return exits
