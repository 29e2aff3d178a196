"""The scheduler loop: the one thread that starts, watches and ends attempts.

Every tick it (1) records attempts that ended, (2) stops attempts that were canceled or ran past
``max_runtime``, and (3) asks the pure policy which queued jobs start now, then launches them.
API handlers only write requests into the store and :meth:`SchedulerLoop.wake` it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import shutil
import threading
import time
from pathlib import Path

from trainhouse.errors import InvalidTransition, StoreError, TrainhouseError
from trainhouse.executors.base import Executor, Exit, Launch
from trainhouse.scheduler.lifecycle import JobState
from trainhouse.scheduler.policy import QueuedJob, RunningJob, Snapshot, decide
from trainhouse.scheduler.resources import Placement
from trainhouse.spec import JobSpec
from trainhouse.store import BlobStore, Job, Store
from trainhouse.store.jobfiles import JobFiles
from trainhouse.workdir import extract

log = logging.getLogger(__name__)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class SchedulerLoop:
    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        executor: Executor,
        *,
        home: Path,
        server_url: str,
        tick: float = 0.5,
        cancel_grace: float = 10.0,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.executor = executor
        self.home = home
        self.server_url = server_url
        self.tick_seconds = tick
        self.cancel_grace = cancel_grace
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._reasons: dict[int, str] = {}
        self._attempt_started: dict[int, float] = {}

    # -- life ------------------------------------------------------------------------------
    def start(self) -> None:
        self.reconcile()
        self._thread = threading.Thread(target=self._run, name="trainhouse-scheduler", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, *, grace: float = 10.0) -> None:
        """Stop the loop; running attempts are stopped and their jobs go back to the queue."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for ended in self.executor.shutdown(grace=grace):
            self._record_exit(ended)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
            except Exception:  # keep scheduling; the error is in the server log
                log.exception("scheduler tick failed")
            self._wake.wait(self.tick_seconds)
            self._wake.clear()

    def tick(self) -> None:
        for ended in self.executor.poll():
            self._record_exit(ended)
        if self._stopping.is_set():
            return
        self._enforce_stops()
        self._schedule()

    # -- start-up --------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Jobs the store thinks are running were lost with the previous server: requeue them."""
        for job in self.store.list_jobs(states=[JobState.RUNNING]):
            killed = self.executor.kill_orphans(job.id, job.attempts)
            reason = (
                f"the server restarted while attempt {job.attempts} ran"
                + (f" (stopped {killed} leftover processes)" if killed else "")
                + "; resuming from the latest checkpoint"
            )
            self.store.update_attempt(
                job.id, job.attempts, ended_at=time.time(), result="lost", reason=reason
            )
            self._requeue(job, reason, count_restart=False)
        for job in self.store.list_jobs(states=[JobState.RESTARTING, JobState.PREEMPTED]):
            self.store.transition(job.id, JobState.QUEUED, reason=job.reason)

    # -- exits -----------------------------------------------------------------------------
    def _requeue(self, job: Job, reason: str, *, count_restart: bool) -> None:
        restarts = job.restarts + (1 if count_restart else 0)
        self.store.transition(job.id, JobState.RESTARTING, reason=reason, restarts=restarts)
        self.store.transition(job.id, JobState.QUEUED, reason=reason)

    def _failure_reason(self, ended: Exit) -> str:
        files = JobFiles(self.home, ended.job_id)
        rank = ended.failed_rank
        if rank is not None:
            code = ended.rank_exit_codes[str(rank)]
            what = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            text = f"rank {rank} {what}"
            tail = files.tail_text(rank, 5)
        else:
            code = ended.exit_code
            what = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            text = f"the launcher {what}"
            tail = files.tail_text("launcher", 5)
        return f"{text}; last lines:\n{tail}" if tail else text

    def _record_exit(self, ended: Exit) -> None:
        self._attempt_started.pop(ended.job_id, None)
        try:
            job = self.store.get_job(ended.job_id)
        except StoreError:
            return
        codes = ended.rank_exit_codes
        rank = ended.failed_rank
        exit_code = codes[str(rank)] if rank is not None else ended.exit_code
        attempt_fields = {"ended_at": time.time(), "exit_code": exit_code, "rank_exit_codes": codes}
        if job.cancel_requested:
            result, new, reason = "canceled", JobState.CANCELED, "canceled by request"
        elif ended.stop_reason and ended.stop_reason.startswith("max_runtime"):
            result, new, reason = "failed", JobState.FAILED, ended.stop_reason
        elif ended.stop_reason == "the server is shutting down":
            result, reason = "interrupted", "the server stopped while it ran; it resumes on restart"
            self.store.update_attempt(
                job.id, ended.attempt, result=result, reason=reason, **attempt_fields
            )
            self._requeue(job, reason, count_restart=False)
            return
        elif ended.exit_code == 0 and exit_code == 0:
            result, new, reason = "completed", JobState.COMPLETED, "every rank exited 0"
        else:
            reason = self._failure_reason(ended)
            self.store.update_attempt(
                job.id, ended.attempt, result="failed", reason=reason, **attempt_fields
            )
            max_restarts = int(job.spec.get("max_restarts", 0))
            if job.restarts < max_restarts:
                self._requeue(
                    job,
                    f"attempt {ended.attempt} failed ({reason.splitlines()[0]}); restart "
                    f"{job.restarts + 1} of {max_restarts} from the latest checkpoint",
                    count_restart=True,
                )
            else:
                self.store.transition(
                    job.id, JobState.FAILED, reason=reason, exit_code=exit_code or 1
                )
            return
        self.store.update_attempt(
            job.id, ended.attempt, result=result, reason=reason, **attempt_fields
        )
        self.store.transition(job.id, new, reason=reason, exit_code=exit_code)

    # -- stops -----------------------------------------------------------------------------
    def _enforce_stops(self) -> None:
        running = self.executor.running()
        now = time.time()
        for job in self.store.list_jobs(states=[JobState.RUNNING]):
            if job.id not in running:
                continue
            if job.cancel_requested:
                self.executor.stop(job.id, grace=self.cancel_grace, reason="canceled by request")
                continue
            limit = job.spec.get("max_runtime")
            started = self._attempt_started.get(job.id)
            if limit and started is not None and now - started > float(limit):
                self.executor.stop(
                    job.id,
                    grace=float(job.spec.get("preemption_grace", 120)),
                    reason=f"max_runtime exceeded: ran longer than {int(limit)} s",
                )

    # -- scheduling ------------------------------------------------------------------------
    def snapshot(self) -> tuple[Snapshot, dict[int, Job]]:
        """The policy's input, read from the store (no side effects)."""
        queued_jobs = []
        by_id: dict[int, Job] = {}
        for job in self.store.list_jobs(states=[JobState.QUEUED]):
            if job.cancel_requested:
                continue  # _schedule ends it
            spec = JobSpec.model_validate(job.spec)
            queued_jobs.append(QueuedJob(job.id, job.priority, job.created_at, spec.resources))
            by_id[job.id] = job
        running = tuple(
            RunningJob(
                j.id, tuple(Placement.from_dict(p) for p in (j.placement or {}).get("nodes", []))
            )
            for j in self.store.list_jobs(states=[JobState.RUNNING])
        )
        snap = Snapshot(tuple(self.executor.nodes()), running, tuple(queued_jobs))
        return snap, by_id

    def _schedule(self) -> None:
        for job in self.store.list_jobs(states=[JobState.QUEUED]):
            if job.cancel_requested:
                with contextlib.suppress(InvalidTransition, StoreError):
                    self.store.transition(job.id, JobState.CANCELED, reason="canceled by request")
        snap, by_id = self.snapshot()
        if not snap.queued:
            return
        decisions = decide(snap)
        for job_id, placements in decisions.starts:
            self._start(by_id[job_id], placements)
        for job_id, reason in decisions.waiting.items():
            if self._reasons.get(job_id) != reason:
                self._reasons[job_id] = reason
                self.store.update_job(job_id, reason=reason)

    def _start(self, job: Job, placements: tuple[Placement, ...]) -> None:
        token = secrets.token_urlsafe(32)
        placement = {"nodes": [p.to_dict() for p in placements]}
        try:
            job, attempt = self.store.start_attempt(
                job.id, placement=placement, token_hash=hash_token(token)
            )
        except (InvalidTransition, StoreError) as exc:
            log.info("job %s not started: %s", job.id, exc)
            return
        self._reasons.pop(job.id, None)
        files = JobFiles(self.home, job.id)
        workdir = files.attempt(attempt.number) / "workdir"
        spec = JobSpec.model_validate(job.spec)
        try:
            if workdir.exists():
                shutil.rmtree(workdir)
            files.checkpoints.mkdir(parents=True, exist_ok=True)
            extract(self.blobs.path(job.archive_sha256), workdir)
            env = {
                "TRAINHOUSE_URL": self.server_url,
                "TRAINHOUSE_JOB_ID": str(job.id),
                "TRAINHOUSE_JOB_NAME": job.name,
                "TRAINHOUSE_ATTEMPT": str(attempt.number),
                "TRAINHOUSE_JOB_TOKEN": token,
                "TRAINHOUSE_HPARAMS": json.dumps(spec.hparams),
                "TRAINHOUSE_CHECKPOINT_DIR": str(files.checkpoints),
            }
            info = self.executor.launch(
                Launch(job.id, attempt.number, spec, placements, workdir, files.root, env)
            )
        except (TrainhouseError, OSError) as exc:
            reason = f"could not start attempt {attempt.number}: {exc}"
            log.error("job %s: %s", job.id, reason)
            self.store.update_attempt(
                job.id, attempt.number, ended_at=time.time(), result="failed", reason=reason
            )
            self.store.transition(job.id, JobState.FAILED, reason=reason, exit_code=1)
            return
        self._attempt_started[job.id] = time.time()
        self.store.update_attempt(
            job.id, attempt.number, pid=info.pid, pid_create_time=info.create_time
        )
        log.info("job %s attempt %s started (pid %s)", job.id, attempt.number, info.pid)
