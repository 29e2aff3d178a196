"""The one fake executor of the test suite: the full Executor protocol, no processes.

Launched attempts run until the test ends them (:meth:`FakeExecutor.end`), or, with
``exit_code`` set, end on their own at the next poll (what an in-process API test needs of a job
that "runs"). ``job_pids`` reports processes for the resource monitor; ``alive_pids`` are
launchers that survive a server restart (re-adopted by :meth:`adopt`).
"""

from __future__ import annotations

import signal
import threading
from typing import ClassVar

from trainhouse.core.cluster import Node
from trainhouse.executors.base import Exit, Launch, ProcessInfo
from trainhouse.lifecycle import StopReason


class FakeExecutor:
    name: ClassVar[str] = "fake"
    multi_node: ClassVar[bool] = False

    def __init__(
        self,
        node: Node | None = None,
        *,
        exit_code: int | None = None,
        job_pids: dict[int, list[int]] | None = None,
    ) -> None:
        self.node = node or Node("fake", 4, 1 << 30)
        self.exit_code = exit_code  # None: attempts run until end() or stop()
        self.job_pids = job_pids or {}
        self.live: dict[int, int] = {}  # job id -> attempt
        self.exits: list[Exit] = []
        self.launches: list[Launch] = []
        self.stops: list[tuple[int, StopReason]] = []
        self.alive_pids: set[int] = set()  # launchers that survive a server restart
        self.addresses: dict[str, tuple[str, ...]] = {}  # node -> where the server reaches it
        self._lock = threading.Lock()

    # -- inventory -------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        return [self.node]

    def capacity(self) -> list[Node]:
        return [self.node]

    def server_node(self) -> str:
        return self.node.name

    def node_addresses(self, node: str) -> tuple[str, ...]:
        return self.addresses.get(node, ())

    # -- attempts --------------------------------------------------------------------------
    def launch(self, launch: Launch) -> ProcessInfo:
        with self._lock:
            self.launches.append(launch)
            self.live[launch.job_id] = launch.attempt
            if self.exit_code is not None:
                code = self.exit_code
                self.exits.append(Exit(launch.job_id, launch.attempt, code, {"0": code}))
        return ProcessInfo(pid=1, create_time=0.0)

    def adopt(self, job_id: int, attempt: int, info: ProcessInfo) -> bool:
        if info.pid in self.alive_pids:
            with self._lock:
                self.live[job_id] = attempt
            return True
        return False

    def poll(self) -> list[Exit]:
        with self._lock:
            out, self.exits = self.exits, []
            for e in out:
                self.live.pop(e.job_id, None)
        return out

    def stop(
        self, job_id: int, *, grace: float, reason: StopReason, terminate: bool = True
    ) -> None:
        """Recorded; with ``exit_code`` set, the attempt ends at once (as a job that stops when
        told to), killed by SIGTERM."""
        with self._lock:
            self.stops.append((job_id, reason))
            attempt = self.live.get(job_id)
            ending = any(e.job_id == job_id for e in self.exits)
            if self.exit_code is not None and attempt is not None and not ending:
                code = -int(signal.SIGTERM)
                self.exits.append(Exit(job_id, attempt, code, {"0": code}, reason))

    def running(self) -> set[int]:
        with self._lock:
            return set(self.live) | set(self.job_pids)

    def pids(self, job_id: int) -> list[int]:
        return list(self.job_pids.get(job_id, []))

    def kill_orphans(self, job_id: int, attempt: int) -> int:
        return 0

    def shutdown(self, *, grace: float) -> list[Exit]:
        for job_id in list(self.live):
            self.stop(job_id, grace=grace, reason=StopReason.SHUTDOWN)
        return self.poll() if self.exit_code is not None else []

    # -- what tests do ---------------------------------------------------------------------
    def end(self, job_id: int, code: int) -> None:
        """The running attempt of ``job_id`` ends with ``code`` (reported at the next poll)."""
        with self._lock:
            self.exits.append(Exit(job_id, self.live[job_id], code, {"0": code}))
