"""Where a scheduler loop tick goes with many queued jobs: the store, or the policy?

A temporary SQLite store with ``--queued`` QUEUED jobs (1 GPU each, 50 owners) and a
``SchedulerLoop`` over a stub executor with one node and no GPUs, so nothing ever starts and
every tick is the same: list the queue, build the snapshot, decide, publish the reasons. The
stored reasons are first brought up to date (a fresh server writes at most 200 a tick, one
transaction each, until they are), so the ticks timed are a busy server's steady state. It
prints the median of ``--repeats`` (5) calls of: listing the QUEUED jobs from the store,
``SchedulerLoop.snapshot()``, ``decide()`` and ``Scheduler.decide()`` on that snapshot, and a
whole ``tick()``.

    python bench/scheduler_loop.py [--queued 10000] [--repeats 5]

Run it under an older checkout's ``src`` (``PYTHONPATH=old/src``) for the before figure; the
``Scheduler`` column is then n/a. It exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from sqlalchemy import insert

import trainhouse.scheduler.loop as loop
from trainhouse.core.cluster import Node
from trainhouse.executors.base import Exit, Launch, ProcessInfo
from trainhouse.lifecycle import JobState, StopReason
from trainhouse.scheduler.policy import decide
from trainhouse.spec import JobSpec
from trainhouse.store import BlobStore, Store
from trainhouse.store import tables as t


class IdleExecutor:
    """One node with no GPUs and nothing running: every GPU job waits."""

    name: ClassVar[str] = "idle"
    multi_node: ClassVar[bool] = False

    def __init__(self) -> None:
        self.node = Node("n0", 64, 1 << 40)

    def nodes(self) -> list[Node]:
        return [self.node]

    def capacity(self) -> list[Node]:
        return [self.node]

    def server_node(self) -> str:
        return self.node.name

    def launch(self, launch: Launch) -> ProcessInfo:
        raise AssertionError("nothing fits: nothing is launched")

    def adopt(self, job_id: int, attempt: int, info: ProcessInfo) -> bool:
        return False

    def poll(self) -> list[Exit]:
        return []

    def stop(
        self, job_id: int, *, grace: float, reason: StopReason, terminate: bool = True
    ) -> None:
        pass

    def running(self) -> set[int]:
        return set()

    def pids(self, job_id: int) -> list[int]:
        return []

    def kill_orphans(self, job_id: int, attempt: int) -> int:
        return 0

    def shutdown(self, *, grace: float) -> list[Exit]:
        return []


def median_ms(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What a scheduler loop tick spends its time on")
    parser.add_argument("--queued", type=int, default=10_000, help="queued jobs (10000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each (5)")
    parser.add_argument(
        "--smoke", action="store_true", help="200 queued jobs, 1 call each (the suite's check)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.queued, args.repeats = 200, 1
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        store = Store(f"sqlite:///{home / 'db.sqlite'}")
        sched = loop.SchedulerLoop(
            store, BlobStore(home / "blobs"), IdleExecutor(), home=home, server_url="http://x"
        )
        spec = JobSpec.model_validate(
            {
                "entrypoint": "python train.py",
                "resources": {
                    "nodes": 1,
                    "procs_per_node": 1,
                    "gpus_per_node": 1,
                    "cpus_per_proc": 4,
                },
            }
        ).model_dump(mode="json")
        now = time.time()
        rows = [
            {
                "name": f"j{i}",
                "owner": f"u{i % 50}",
                "state": JobState.QUEUED,
                "priority": "normal",
                "spec": spec,
                "archive_sha256": "0" * 64,
                "created_at": now - i,
                "updated_at": now,
                "attempts": 0,
                "restarts": 0,
                "cancel_requested": False,
                "reason": "waiting for the scheduler",
            }
            for i in range(args.queued)
        ]
        with store.jobs.db.transaction() as conn:
            conn.execute(insert(t.jobs), rows)
        sched.tick()
        # the reasons as stored already: a busy server's steady state
        sched._reasons = {j: r.split(": ", 1)[-1] for j, r in sched.waiting.items()}
        sched.tick()
        snap, _ = sched.snapshot()
        listing = median_ms(lambda: store.jobs.list(states=[JobState.QUEUED]), args.repeats)
        snapshot = median_ms(sched.snapshot, args.repeats)
        reference = median_ms(lambda: decide(snap), args.repeats)
        scheduler = getattr(sched, "scheduler", None)
        incremental = (
            f"{median_ms(lambda: scheduler.decide(snap), args.repeats):.0f} ms"
            if scheduler is not None
            else "n/a"
        )
        tick = median_ms(sched.tick, args.repeats)
        store.close()
    print(f"code: {Path(loop.__file__).parent}")
    print(
        f"{args.queued} queued, median of {args.repeats}: list QUEUED {listing:.0f} ms; "
        f"snapshot() {snapshot:.0f} ms; decide() {reference:.0f} ms; Scheduler.decide() "
        f"{incremental}; whole tick {tick:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
