"""``trainhouse server`` with a stand-in executor that starts no process (for bench/load.py).

    python bench/_load_server.py --port P --home DIR [--db URL] --cpus 128 --gpus 0 ...

Every argument is ``trainhouse server``'s: this runs the real command (the same option parsing,
logging, uvicorn, ``create_app``, scheduler loop, store, routes, credential checks and metric
ingest). Only the executor is replaced, by one more entry in the executors' registry
(``--executor stand-in``): its
``launch`` starts nothing, appends ``{"job_id", "attempt", "token", "url"}`` (the attempt's
``TRAINHOUSE_JOB_TOKEN``, made by the scheduler loop) as a JSON line to the file named by
``$TRAINHOUSE_BENCH_TOKENS``, and reports the attempt as running until the scheduler stops it
(cancel, preemption, max_runtime, shutdown), so the benchmark can report metrics for 100
"running" jobs with their real per-attempt credentials without starting 100 torch processes.

With ``$TRAINHOUSE_BENCH_ONE_PER_TRANSACTION`` set, the server's ``report_group_commit``
setting is off (a setting without a command-line option): each report is stored in a
transaction of its own, as before group commit (bench/load.py's baseline runs).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import psutil

from trainhouse.core.cluster import Node
from trainhouse.executors import registry
from trainhouse.executors.base import Exit, Launch, ProcessInfo
from trainhouse.executors.inventory import local_node
from trainhouse.lifecycle import StopReason

TOKENS_ENV = "TRAINHOUSE_BENCH_TOKENS"
ONE_PER_TRANSACTION_ENV = "TRAINHOUSE_BENCH_ONE_PER_TRANSACTION"


class StandInExecutor:
    """The ``Executor`` protocol without processes: launched attempts run until stopped."""

    name = "stand-in"
    multi_node = False

    def __init__(self, node: Node, tokens: Path) -> None:
        self.node = node
        self.tokens = tokens
        self._lock = threading.Lock()
        self._live: dict[int, int] = {}  # job id -> attempt
        self._exits: list[Exit] = []
        me = psutil.Process()
        # the attempt's "launcher" is the server process itself (nothing else runs)
        self._info = ProcessInfo(pid=me.pid, create_time=me.create_time())

    def nodes(self) -> list[Node]:
        return [self.node]

    def capacity(self) -> list[Node]:
        return [self.node]

    def server_node(self) -> str:
        return self.node.name

    def launch(self, launch: Launch) -> ProcessInfo:
        record = {
            "job_id": launch.job_id,
            "attempt": launch.attempt,
            "token": launch.env.token,
            "url": launch.env.url,
        }
        with self._lock:
            with self.tokens.open("a") as fh:
                fh.write(json.dumps(record) + "\n")
            self._live[launch.job_id] = launch.attempt
        return self._info

    def adopt(self, job_id: int, attempt: int, info: ProcessInfo) -> bool:
        return False  # nothing outlives the server that "launched" it

    def poll(self) -> list[Exit]:
        with self._lock:
            out, self._exits = self._exits, []
            for ended in out:
                self._live.pop(ended.job_id, None)
        return out

    def stop(
        self, job_id: int, *, grace: float, reason: StopReason, terminate: bool = True
    ) -> None:
        # a real job stops at once when told to (the SDK's should_stop) or at SIGTERM
        with self._lock:
            attempt = self._live.get(job_id)
            if attempt is not None and all(e.job_id != job_id for e in self._exits):
                code = -signal.SIGTERM
                self._exits.append(Exit(job_id, attempt, code, {"0": code}, stop_reason=reason))

    def running(self) -> set[int]:
        with self._lock:
            return set(self._live)

    def pids(self, job_id: int) -> list[int]:
        return []

    def kill_orphans(self, job_id: int, attempt: int) -> int:
        return 0

    def shutdown(self, *, grace: float) -> list[Exit]:
        for job_id in self.running():
            self.stop(job_id, grace=grace, reason=StopReason.SHUTDOWN)
        return self.poll()


def build(options: registry.ExecutorOptions) -> StandInExecutor:
    tokens = os.environ.get(TOKENS_ENV)
    if not tokens:
        raise SystemExit(f"{TOKENS_ENV} must name the file the job tokens are written to")
    return StandInExecutor(local_node(options.cpus, options.gpus), Path(tokens))


def one_per_transaction() -> None:
    """Make the app ``trainhouse server`` builds store each report in its own transaction."""
    import trainhouse.server
    from trainhouse.server import Settings

    create_app = trainhouse.server.create_app

    def one_each(settings: Settings, **kwargs: Any) -> Any:
        settings.report_group_commit = False
        return create_app(settings, **kwargs)

    trainhouse.server.create_app = one_each  # what the command's serve() imports


def main() -> None:
    registry.EXECUTORS[StandInExecutor.name] = registry.ExecutorEntry(
        StandInExecutor.name, "no processes (bench/load.py)", build, lambda _options: None
    )
    if os.environ.get(ONE_PER_TRANSACTION_ENV):
        one_per_transaction()
    from trainhouse.cli.app import app

    app(args=["server", "--executor", StandInExecutor.name, *sys.argv[1:]], prog_name="trainhouse")


if __name__ == "__main__":
    main()
