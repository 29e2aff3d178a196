"""The scheduler loop: the one thread that starts, watches and ends attempts.

Every tick it (1) records attempts that ended, (2) stops attempts that were canceled or ran past
``max_runtime``, and (3) asks the pure policy which queued jobs start now, then launches them.
API handlers only write requests into the store and :meth:`SchedulerLoop.wake` it.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainhouse.cluster import Placement
from trainhouse.errors import InvalidTransition, StoreError
from trainhouse.executors.base import Executor, Exit, Launch, ProcessInfo
from trainhouse.layout import JobEnv, JobLayout
from trainhouse.lifecycle import JobState, StopReason
from trainhouse.scheduler.failures import DEFAULT_MAX_INFRA_RESTARTS, analyse
from trainhouse.scheduler.fairshare import DEFAULT_ENTRY_SECONDS, DEFAULT_HALF_LIFE, UsageLedger
from trainhouse.scheduler.policy import (
    Decisions,
    QueuedJob,
    Quota,
    RunningJob,
    Snapshot,
    cluster_totals,
    cost_rate,
    decide,
)
from trainhouse.scheduler.resources import Demand
from trainhouse.spec import JobSpec
from trainhouse.storage import open_storage
from trainhouse.store import BlobStore, Job, Store
from trainhouse.store.spool import ingest_spool
from trainhouse.tokens import hash_token, job_token
from trainhouse.workdir import extract

log = logging.getLogger(__name__)


USAGE_SAVE_SECONDS = 5.0
REASON_WRITES_PER_TICK = 200


@dataclass(frozen=True)
class SchedulerConfig:
    half_life: float = DEFAULT_HALF_LIFE
    entry_seconds: float = DEFAULT_ENTRY_SECONDS
    default_quota: Quota = field(default_factory=Quota)
    preemption: bool = True
    max_infra_restarts: int = DEFAULT_MAX_INFRA_RESTARTS  # restarts after infra failures, per job


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
        checkpoint_location: Callable[[int], str] | None = None,
        on_attempt_end: Callable[[int, int], object] | None = None,
        config: SchedulerConfig | None = None,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.executor = executor
        self.home = home
        self.server_url = server_url
        self.tick_seconds = tick
        self.cancel_grace = cancel_grace
        # called with (job id, attempt) before an ended attempt is recorded
        self.on_attempt_end = on_attempt_end
        # a job's checkpoint directory or URL (default: HOME/jobs/<id>/checkpoints)
        self.checkpoint_location = checkpoint_location or (
            lambda job_id: str(JobLayout(home, job_id).checkpoints)
        )
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._reasons: dict[int, str] = {}
        self.waiting: dict[int, str] = {}  # queued job id -> why it waits, as of the last tick
        self._attempt_started: dict[int, float] = {}
        self.config = config or SchedulerConfig()
        values, saved_at = store.usage()
        self.usage = UsageLedger(
            values,
            at=saved_at or time.time(),
            half_life=self.config.half_life,
            entry_seconds=self.config.entry_seconds,
        )
        self._usage_saved = time.time()
        # called with the seconds each policy decision took (the server's Prometheus histogram)
        self.decision_observer: Callable[[float], object] | None = None

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
        self.store.save_usage(self.usage.snapshot(), self.usage.at)

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
            try:
                self._record_exit(ended)
            except Exception:  # one bad record must not strand the others in RUNNING
                log.exception(
                    "job %s: recording the end of attempt %s failed; it is swept up as lost",
                    ended.job_id,
                    ended.attempt,
                )
        if self._stopping.is_set():
            return
        self._enforce_stops()
        self._schedule()

    # -- start-up --------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Take over from the previous server: attempts still running are re-adopted; attempts
        that died while no server watched them are failures, restarted from their checkpoint."""
        for job in self.store.list_jobs(states=[JobState.RUNNING]):
            attempt = self.store.get_attempt(job.id, job.attempts)
            if attempt.pid is not None and attempt.pid_create_time is not None:
                info = ProcessInfo(attempt.pid, attempt.pid_create_time)
                if self.executor.adopt(job.id, job.attempts, info):
                    self._attempt_started[job.id] = attempt.started_at
                    self.store.add_event(
                        job.id, f"the server restarted; attempt {job.attempts} kept running"
                    )
                    continue
            self._lost(job, "was lost while the server was down")
        for job in self.store.list_jobs(states=[JobState.RESTARTING, JobState.PREEMPTED]):
            self.store.transition(job.id, JobState.QUEUED, reason=job.reason)

    # -- exits -----------------------------------------------------------------------------
    def _lost(self, job: Job, what: str = "was lost track of") -> None:
        """A RUNNING job with no attempt in the executor: its end was never recorded."""
        killed = self.executor.kill_orphans(job.id, job.attempts)
        reason = f"attempt {job.attempts} {what}" + (
            f" (stopped {killed} leftover processes)" if killed else ""
        )
        log.error("job %s: %s", job.id, reason)
        self.store.update_attempt(
            job.id,
            job.attempts,
            ended_at=time.time(),
            result="lost",
            reason=reason,
            failure="infra",
        )
        self._restart_or_fail(job, job.attempts, reason, infra=True, exit_code=1)

    def _requeue(self, job: Job, reason: str, counters: dict[str, Any] | None = None) -> None:
        self.store.transition(job.id, JobState.RESTARTING, reason=reason, **(counters or {}))
        if self.store.get_job(job.id).cancel_requested:  # canceled while it was restarting
            self.store.transition(job.id, JobState.CANCELED, reason="canceled by request")
        else:
            self.store.transition(job.id, JobState.QUEUED, reason=reason)

    def _restart_or_fail(
        self,
        job: Job,
        attempt: int,
        summary: str,
        *,
        infra: bool,
        exit_code: int,
        permanent: str | None = None,
        detail: str = "",
    ) -> None:
        """After a failed attempt: restart from the latest checkpoint, if the budget allows."""
        if infra:
            used, limit = job.infra_restarts, self.config.max_infra_restarts
            counter, label = "infra_restarts", "infrastructure failure"
        else:
            used, limit = job.restarts, int(job.spec.get("max_restarts", 0))
            counter, label = "restarts", "failure"
        if permanent is None and used < limit:
            self._requeue(
                job,
                f"attempt {attempt} failed ({summary}; {label}); restart {used + 1} of {limit} "
                "from the latest checkpoint",
                {counter: used + 1},
            )
            return
        if permanent is not None:
            why = f"not restarted: {permanent}"
        elif infra:
            why = f"{limit} restarts after infrastructure failures used up (max_infra_restarts)"
        else:
            why = f"max_restarts ({limit}) used up" if limit else "max_restarts is 0"
        reason = f"attempt {attempt} failed: {summary}; {why}" + (
            f"; last lines:\n{detail}" if detail else ""
        )
        self.store.transition(job.id, JobState.FAILED, reason=reason, exit_code=exit_code or 1)

    def _record_exit(self, ended: Exit) -> None:
        self._attempt_started.pop(ended.job_id, None)
        try:
            job = self.store.get_job(ended.job_id)
        except StoreError:
            return
        # what the attempt could not send (the server was down as it ended) comes first
        ingest_spool(self.store, job.id, JobLayout(self.home, job.id).attempt(ended.attempt))
        if self.on_attempt_end is not None:
            try:
                self.on_attempt_end(job.id, ended.attempt)
            except Exception:  # the exit is recorded all the same
                log.exception("job %s: after attempt %s", job.id, ended.attempt)
        codes = ended.rank_exit_codes
        rank = ended.failed_rank
        exit_code = codes[str(rank)] if rank is not None else ended.exit_code
        attempt_fields = {"ended_at": time.time(), "exit_code": exit_code, "rank_exit_codes": codes}
        if job.cancel_requested:
            result, new, reason = "canceled", JobState.CANCELED, "canceled by request"
        elif job.preempt_requested:
            reason = job.reason or "preempted"
            self.store.update_attempt(
                job.id, ended.attempt, result="preempted", reason=reason, **attempt_fields
            )
            self.store.transition(
                job.id, JobState.PREEMPTED, reason=reason, preempt_requested=False
            )
            self.store.transition(job.id, JobState.QUEUED, reason=reason)
            return
        elif ended.requeue is not None:  # it never started: no restart is counted
            self.store.update_attempt(
                job.id, ended.attempt, ended_at=time.time(), result="unplaced", reason=ended.requeue
            )
            self._requeue(job, ended.requeue)
            return
        elif ended.stop_reason is StopReason.MAX_RUNTIME:
            limit = job.spec.get("max_runtime") or 0
            result, new = "failed", JobState.FAILED
            reason = f"max_runtime exceeded: ran longer than {int(limit)} s"
        elif ended.stop_reason is StopReason.SHUTDOWN:
            result, reason = "interrupted", "the server stopped while it ran; it resumes on restart"
            self.store.update_attempt(
                job.id, ended.attempt, result=result, reason=reason, **attempt_fields
            )
            self._requeue(job, reason)
            return
        elif ended.exit_code == 0 and exit_code == 0:
            result, new, reason = "completed", JobState.COMPLETED, "every rank exited 0"
        else:
            spec = JobSpec.model_validate(job.spec)
            failure = analyse(
                ended, JobLayout(self.home, job.id), spec.resources.procs, spec.no_restart_on
            )
            reason = failure.summary + (
                f"; not restarted: {failure.permanent}" if failure.permanent else ""
            )
            self.store.update_attempt(
                job.id,
                ended.attempt,
                result="failed",
                reason=reason,
                failure=failure.kind,
                failed_rank=failure.rank,
                log_tail=failure.log_tail,
                **{**attempt_fields, "exit_code": failure.code},
            )
            self._restart_or_fail(
                job,
                ended.attempt,
                failure.summary,
                infra=failure.kind == "infra",
                exit_code=failure.code if failure.code > 0 else 128 - failure.code,
                permanent=failure.permanent,
                detail="\n".join(failure.log_tail.splitlines()[-5:]),
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
                self._lost(job)
                continue
            if job.cancel_requested:
                # should_stop() turns true; SIGTERM only if it has not exited within the grace
                self.executor.stop(
                    job.id, grace=self.cancel_grace, reason=StopReason.CANCEL, terminate=False
                )
                continue
            limit = job.spec.get("max_runtime")
            started = self._attempt_started.get(job.id)
            if limit and started is not None and now - started > float(limit):
                self.executor.stop(
                    job.id,
                    grace=float(job.spec.get("preemption_grace", 120)),
                    reason=StopReason.MAX_RUNTIME,
                    terminate=False,
                )

    # -- scheduling ------------------------------------------------------------------------
    def _advance_usage(
        self, now: float, running: tuple[RunningJob, ...], totals: tuple[int, int]
    ) -> None:
        total_gpus, total_cpus = totals
        self.usage.advance(
            now,
            [
                (r.owner, cost_rate(Demand(1, r.cpus, r.gpus), total_gpus, total_cpus))
                for r in running
            ],
        )
        if now - self._usage_saved >= USAGE_SAVE_SECONDS:
            self.store.save_usage(self.usage.snapshot(), now)
            self._usage_saved = now

    def snapshot(self, extra: QueuedJob | None = None) -> tuple[Snapshot, dict[int, Job]]:
        """The policy's input, read from the store (no side effects)."""
        now = time.time()
        queued_jobs = []
        by_id: dict[int, Job] = {}
        for job in self.store.list_jobs(states=[JobState.QUEUED]):
            if job.cancel_requested:
                continue  # _schedule ends it
            spec = JobSpec.model_validate(job.spec)
            queued_jobs.append(
                QueuedJob(
                    job.id,
                    job.priority,
                    job.created_at,
                    Demand.of(spec.resources),
                    owner=job.owner,
                    max_runtime=spec.max_runtime,
                )
            )
            by_id[job.id] = job
        if extra is not None:
            queued_jobs.append(extra)
        running_jobs = self.store.list_jobs(states=[JobState.RUNNING])
        checkpointed = self.store.last_checkpoint_times([j.id for j in running_jobs])
        running = tuple(
            RunningJob(
                j.id,
                tuple(Placement.from_dict(p) for p in (j.placement or {}).get("nodes", [])),
                owner=j.owner,
                priority=j.priority,
                started_at=self._attempt_started.get(j.id, j.started_at or now),
                max_runtime=j.spec.get("max_runtime"),
                last_checkpoint_at=checkpointed.get(j.id),
                stopping=j.cancel_requested or j.preempt_requested,
                stop_deadline=now if (j.cancel_requested or j.preempt_requested) else None,
            )
            for j in running_jobs
        )
        limits = self.store.user_limits()
        snap = Snapshot(
            tuple(self.executor.nodes()),
            running,
            tuple(queued_jobs),
            now=now,
            usage=self.usage.snapshot(),
            shares={o: lim.share for o, lim in limits.items()},
            quotas={
                o: Quota(
                    lim.max_gpus if lim.max_gpus is not None else self.config.default_quota.gpus,
                    lim.max_cpus if lim.max_cpus is not None else self.config.default_quota.cpus,
                )
                for o, lim in limits.items()
            },
            default_quota=self.config.default_quota,
            preemption=self.config.preemption,
        )
        return snap, by_id

    def plan(self, extra: QueuedJob | None = None) -> Decisions:
        """What the policy would decide now (with ``extra`` queued too); changes nothing."""
        snap, _ = self.snapshot(extra)
        return decide(snap)

    def _schedule(self) -> None:
        for job in self.store.list_jobs(states=[JobState.QUEUED]):
            if job.cancel_requested:
                with contextlib.suppress(InvalidTransition, StoreError):
                    self.store.transition(job.id, JobState.CANCELED, reason="canceled by request")
        snap, by_id = self.snapshot()
        totals = cluster_totals(snap.nodes)
        self._advance_usage(snap.now, snap.running, totals)
        if not snap.queued:
            return
        began = time.perf_counter()
        decisions = decide(snap)
        if self.decision_observer is not None:
            self.decision_observer(time.perf_counter() - began)
        for job_id, placements in decisions.starts:
            job = by_id[job_id]
            if self._start(job, placements):
                demand = Demand(len(placements), placements[0].cpus, len(placements[0].gpus))
                self.usage.charge_start(job.owner, cost_rate(demand, *totals))
        for pre in decisions.preemptions:
            self._preempt(pre.victim, pre.reason)
        self.waiting = decisions.waiting
        # the store keeps each waiting job's reason too, but a queue of thousands shifts its
        # positions at every start: write only reasons that changed beyond the position,
        # a bounded number per tick (readers take the live ones from `waiting`)
        written = 0
        for job_id, reason in decisions.waiting.items():
            gist = reason.split(": ", 1)[-1]
            if self._reasons.get(job_id) != gist and written < REASON_WRITES_PER_TICK:
                self._reasons[job_id] = gist
                self.store.update_job(job_id, reason=reason)
                written += 1

    def _preempt(self, job_id: int, reason: str) -> None:
        job = self.store.get_job(job_id)
        if job.state is not JobState.RUNNING or job.preempt_requested:
            return
        grace = float(job.spec.get("preemption_grace", 120))
        self.store.update_job(job_id, preempt_requested=True, reason=reason)
        # the SDK's should_stop() turns true on every rank; SIGKILL only after the grace period
        self.executor.stop(job_id, grace=grace, reason=StopReason.PREEMPT, terminate=False)
        log.info("job %s: %s (grace %.0f s)", job_id, reason, grace)

    def _start(self, job: Job, placements: tuple[Placement, ...]) -> bool:
        token = job_token(job.id)
        placement = {"nodes": [p.to_dict() for p in placements]}
        try:
            job, attempt = self.store.start_attempt(
                job.id, placement=placement, token_hash=hash_token(token)
            )
        except (InvalidTransition, StoreError) as exc:
            log.info("job %s not started: %s", job.id, exc)
            return False
        self._reasons.pop(job.id, None)
        files = JobLayout(self.home, job.id)
        workdir = files.attempt(attempt.number).workdir
        try:
            spec = JobSpec.model_validate(job.spec)
            if workdir.exists():
                shutil.rmtree(workdir)
            checkpoints = self.checkpoint_location(job.id)
            open_storage(checkpoints).makedirs()
            extract(self.blobs.path(job.archive_sha256), workdir)
            env = JobEnv(
                url=self.server_url,
                job_id=job.id,
                job_name=job.name,
                attempt=attempt.number,
                token=token,
                checkpoints=checkpoints,
                hparams=spec.hparams,
            )
            info = self.executor.launch(Launch(spec, placements, files, env))
        except Exception as exc:  # whatever it was, the job must not stay RUNNING
            reason = f"could not start attempt {attempt.number}: {exc}"
            log.error("job %s: %s", job.id, reason)
            self.store.update_attempt(
                job.id, attempt.number, ended_at=time.time(), result="failed", reason=reason
            )
            self.store.transition(job.id, JobState.FAILED, reason=reason, exit_code=1)
            return False
        self._attempt_started[job.id] = time.time()
        self.store.update_attempt(
            job.id, attempt.number, pid=info.pid, pid_create_time=info.create_time
        )
        log.info("job %s attempt %s started (pid %s)", job.id, attempt.number, info.pid)
        return True
