"""The scheduler loop: the one thread that starts, watches and ends attempts.

Every tick it (1) records attempts that ended, (2) stops attempts that were canceled or ran past
``max_runtime``, and (3) asks the pure policy (:mod:`~trainhouse.scheduler.policy`) which queued
jobs start now, then launches them. What an attempt's end means is decided by the pure
:mod:`~trainhouse.scheduler.outcome`; the loop only applies it. API handlers only write
requests into the store and :meth:`SchedulerLoop.wake` it; an executor with ``notify_exits``
(the local one) wakes it when an attempt ends.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainhouse.core import envspec
from trainhouse.core.background import BackgroundLoop
from trainhouse.core.cluster import Placements
from trainhouse.core.datasets import StageRequest
from trainhouse.core.errors import InvalidTransition, StoreError
from trainhouse.core.flows import verdict
from trainhouse.core.lifecycle import AttemptResult, JobState, StopReason
from trainhouse.core.tokens import hash_token, job_token
from trainhouse.executors.base import Executor, Exit, Launch, ProcessInfo
from trainhouse.ingest import promotions
from trainhouse.ingest.spool import ingest_spool
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.layout import JobEnv, JobLayout
from trainhouse.jobfs.storage import open_storage
from trainhouse.jobfs.workdir import extract
from trainhouse.scheduler import capacity, outcome
from trainhouse.scheduler.elastic import Resize
from trainhouse.scheduler.failures import DEFAULT_MAX_INFRA_RESTARTS, analyse, repeated
from trainhouse.scheduler.fairshare import DEFAULT_ENTRY_SECONDS, DEFAULT_HALF_LIFE, UsageLedger
from trainhouse.scheduler.incremental import Scheduler
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
from trainhouse.store import Attempt, BlobStore, Job, Store

__all__ = ["SchedulerConfig", "SchedulerLoop"]

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


def with_held_gpus(waiting: dict[int, str], snap: Snapshot) -> dict[int, str]:
    """The reasons of jobs waiting for GPUs, with why GPUs the nodes have are held back (a
    process of an ended attempt still holds them: ``Node.held``)."""
    held = "; ".join(note for node in snap.nodes for note in node.held)
    if not held:
        return waiting
    wants_gpus = {job.id for job in snap.queued if job.demand.gpus}
    return {
        job_id: f"{reason}; {held}" if job_id in wants_gpus else reason
        for job_id, reason in waiting.items()
    }


# what a stored job's QueuedJob is kept by: a job's spec changes only with its tier
# (JobRepo.set_priority), and every write of a job sets updated_at
_QueuedKey = tuple[float, str, float, str]


class SchedulerLoop(BackgroundLoop):
    name = "trainhouse-scheduler"

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
        shutdown_grace: float = 10.0,
        checkpoint_location: Callable[[int], str] | None = None,
        on_attempt_end: Callable[[int, int], object] | None = None,
        config: SchedulerConfig | None = None,
        env_defaults: envspec.Defaults | None = None,
    ) -> None:
        super().__init__(tick)
        # the server's index options and cache size for the jobs' environments
        self.env_defaults = env_defaults or envspec.Defaults()
        self.store = store
        self.blobs = blobs
        self.executor = executor
        self.home = home
        self.server_url = server_url
        self.cancel_grace = cancel_grace
        self.shutdown_grace = shutdown_grace  # what running attempts get when the server stops
        # called with (job id, attempt) before an ended attempt is recorded
        self.on_attempt_end = on_attempt_end
        #: each node's cache of staged dataset versions, in bytes (0: no limit)
        self.dataset_cache_bytes = 0
        # a job's checkpoint directory or URL (default: HOME/jobs/<id>/checkpoints)
        self.checkpoint_location = checkpoint_location or (
            lambda job_id: str(JobLayout(home, job_id).checkpoints)
        )
        self._reasons: dict[int, str] = {}
        self.waiting: dict[int, str] = {}  # queued job id -> why it waits, as of the last tick
        self._attempt_started: dict[int, float] = {}
        self.config = config or SchedulerConfig()
        values, saved_at = store.quotas.usage()
        self.usage = UsageLedger(
            values,
            at=saved_at or time.time(),
            half_life=self.config.half_life,
            entry_seconds=self.config.entry_seconds,
        )
        self._usage_saved = time.time()
        # the policy with its queue index kept between ticks (the loop thread's only)
        self.scheduler = Scheduler()
        # job id -> (what it was built from, the QueuedJob): a stored spec is parsed (pydantic,
        # ~70 us) once, not at every tick; replaced whole at each snapshot, never mutated
        self._queued_jobs: dict[int, tuple[_QueuedKey, QueuedJob]] = {}
        # called with the seconds each policy decision took (the server's Prometheus histogram)
        self.decision_observer: Callable[[float], object] | None = None
        # an executor that can tell when an attempt ends wakes the loop: the end is recorded
        # (and the GPUs go to the next job) at once rather than at the next tick
        notify_exits = getattr(executor, "notify_exits", None)
        if callable(notify_exits):
            notify_exits(self.wake)

    @property
    def tick_seconds(self) -> float:
        return self.interval or 0.0

    # -- life ------------------------------------------------------------------------------
    def on_start(self) -> None:
        self.reconcile()

    def on_stop(self) -> None:
        """Running attempts are stopped and their jobs go back to the queue."""
        for ended in self.executor.shutdown(grace=self.shutdown_grace):
            self._record_exit(ended)
        self.store.quotas.save_usage(self.usage.snapshot(), self.usage.at)

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
        for job in self.store.jobs.list(states=[JobState.RUNNING]):
            attempt = self.store.jobs.attempt(job.id, job.attempts)
            if attempt.pid is not None and attempt.pid_create_time is not None:
                info = ProcessInfo(attempt.pid, attempt.pid_create_time)
                if self.executor.adopt(job.id, job.attempts, info):
                    self._attempt_started[job.id] = attempt.started_at
                    self.store.jobs.add_event(
                        job.id, f"the server restarted; attempt {job.attempts} kept running"
                    )
                    continue
            self._lost(job, "was lost while the server was down")
        for job in self.store.jobs.list(states=[JobState.RESTARTING, JobState.PREEMPTED]):
            self.store.jobs.transition(job.id, JobState.QUEUED, reason=job.reason)
        for job_id in self.store.flows.undecided():  # it completed as the server went down
            self._completed(job_id)

    def _completed(self, job_id: int) -> None:
        """Decide a completed job's ``promote:`` (once; a server that died before it had
        decided does it at start-up)."""
        try:
            promotions.decide(self.store, job_id)
        except Exception:  # decided at the next start-up; the job's end stands
            log.exception("job %s: deciding its promotion failed", job_id)

    # -- exits -----------------------------------------------------------------------------
    def _lost(self, job: Job, what: str = "was lost track of") -> None:
        """A RUNNING job with no attempt in the executor: its end was never recorded."""
        killed = self.executor.kill_orphans(job.id, job.attempts)
        reason = f"attempt {job.attempts} {what}" + (
            f" (stopped {killed} leftover processes)" if killed else ""
        )
        log.error("job %s: %s", job.id, reason)
        self._apply(
            job,
            job.attempts,
            outcome.lost(job, reason, max_infra_restarts=self.config.max_infra_restarts),
        )

    def _record_exit(self, ended: Exit) -> None:
        self._attempt_started.pop(ended.job_id, None)
        try:
            job = self.store.jobs.get(ended.job_id)
        except StoreError:
            return
        layout = JobLayout(self.home, job.id)
        # what the attempt could not send (the server was down as it ended) comes first
        ingest_spool(self.store.metrics, job.id, layout.attempt(ended.attempt), within=self.home)
        if self.on_attempt_end is not None:
            try:
                self.on_attempt_end(job.id, ended.attempt)
            except Exception:  # the exit is recorded all the same
                log.exception("job %s: after attempt %s", job.id, ended.attempt)
        failure = None
        if outcome.needs_analysis(job, ended):
            spec = job.spec
            # the ranks this attempt had (an elastic job's size changes between attempts)
            procs = max((p.procs for p in job.placement), default=spec.resources.procs)
            failure = analyse(ended, layout, procs, spec.no_restart_on)
            failure = repeated(failure, self._last_failed(job.id, ended.attempt))
        self._apply(
            job,
            ended.attempt,
            outcome.outcome(job, ended, failure, max_infra_restarts=self.config.max_infra_restarts),
        )

    def _last_failed(self, job_id: int, attempt: int) -> Attempt | None:
        """The job's last failed attempt before ``attempt`` (across resumes), if any."""
        failed = [
            a
            for a in self.store.jobs.attempts(job_id)
            if a.number < attempt and a.result == AttemptResult.FAILED
        ]
        return failed[-1] if failed else None

    def _apply(self, job: Job, attempt: int, out: outcome.Outcome) -> None:
        """Record how the attempt ended and move its job where the outcome says."""
        self.store.jobs.update_attempt(
            job.id, attempt, ended_at=time.time(), **out.attempt.fields()
        )
        if out.via is JobState.PREEMPTED:
            self.store.jobs.transition(
                job.id,
                JobState.PREEMPTED,
                reason=out.reason,
                preempt_requested=False,
                resize_requested=False,
            )
            self.store.jobs.transition(job.id, JobState.QUEUED, reason=out.reason)
        elif out.via is JobState.RESTARTING:
            self.store.jobs.transition(
                job.id, JobState.RESTARTING, reason=out.reason, **out.counters
            )
            if self.store.jobs.get(job.id).cancel_requested:  # canceled while it restarted
                self.store.jobs.transition(job.id, JobState.CANCELED, reason=outcome.CANCELED)
            else:
                self.store.jobs.transition(job.id, JobState.QUEUED, reason=out.reason)
        else:
            self.store.jobs.transition(
                job.id, out.state, reason=out.reason, exit_code=out.exit_code
            )
            if out.state is JobState.COMPLETED and job.spec_data.get("promote"):
                self._completed(job.id)
            # the compilers' caches only serve the job's next attempts: there are none
            try:
                jobfiles.remove(self.home, JobLayout(self.home, job.id).cache)
            except OSError as exc:
                log.warning("job %s: its caches were not removed: %s", job.id, exc)

    # -- stops -----------------------------------------------------------------------------
    def _enforce_stops(self) -> None:
        running = self.executor.running()
        now = time.time()
        for job in self.store.jobs.list(states=[JobState.RUNNING]):
            if job.id not in running:
                self._lost(job)
                continue
            stop = outcome.stop_reason(job, self._attempt_started.get(job.id), now)
            if stop is None or stop.reason in (StopReason.PREEMPT, StopReason.RESIZE):
                continue  # asked for once, by _preempt or _resize, with its grace
            # should_stop() turns true; SIGTERM only if it has not exited within the grace
            grace = (
                self.cancel_grace
                if stop.reason in (StopReason.CANCEL, StopReason.PRUNE)
                else float(job.spec.preemption_grace)
            )
            self.executor.stop(job.id, grace=grace, reason=stop.reason, terminate=False)

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
            self.store.quotas.save_usage(self.usage.snapshot(), now)
            self._usage_saved = now

    def snapshot(
        self, extra: QueuedJob | None = None, queued: list[Job] | None = None
    ) -> tuple[Snapshot, dict[int, Job]]:
        """The policy's input, read from the store (no side effects but a cache of parsed
        specs). ``queued``: the QUEUED jobs, when the caller has just listed them."""
        now = time.time()
        queued_jobs = []
        by_id: dict[int, Job] = {}
        known, kept = self._queued_jobs, {}
        if queued is None:
            queued, _ = self._gate(self.store.jobs.list(states=[JobState.QUEUED]), end=False)
        for job in queued:
            if job.cancel_requested:
                continue  # _schedule ends it
            if job.held:
                continue  # a clone whose checkpoint is being copied in
            key = (job.updated_at, job.priority, job.created_at, job.owner)
            cached = known.get(job.id)
            if cached is not None and cached[0] == key:
                entry = cached[1]
            else:
                spec = job.spec
                entry = QueuedJob(
                    job.id,
                    job.priority,
                    job.created_at,
                    Demand.of(spec.resources),
                    owner=job.owner,
                    max_runtime=spec.max_runtime,
                )
            kept[job.id] = (key, entry)
            queued_jobs.append(entry)
            by_id[job.id] = job
        self._queued_jobs = kept
        if extra is not None:
            queued_jobs.append(extra)
        running_jobs = self.store.jobs.list(states=[JobState.RUNNING])
        checkpointed = self.store.checkpoints.last_times([j.id for j in running_jobs])
        running = tuple(self._running(j, now, checkpointed.get(j.id)) for j in running_jobs)
        limits = self.store.quotas.limits()
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

    def _running(self, j: Job, now: float, checkpointed: float | None) -> RunningJob:
        stopping = j.cancel_requested or j.preempt_requested or j.prune_requested
        stopping = stopping or j.resize_requested
        spec = j.spec
        return RunningJob(
            j.id,
            j.placement,
            owner=j.owner,
            priority=j.priority,
            started_at=self._attempt_started.get(j.id, j.started_at or now),
            max_runtime=spec.max_runtime,
            last_checkpoint_at=checkpointed,
            stopping=stopping,
            stop_deadline=now if stopping else None,
            demand=Demand.of(spec.resources) if spec.resources.elastic else None,
            resize_interval=float(spec.resize_interval),
        )

    def plan(self, extra: QueuedJob | None = None) -> Decisions:
        """What the policy would decide now (with ``extra`` queued too); changes nothing."""
        snap, _ = self.snapshot(extra)
        return decide(snap)

    def _gate(self, queued: list[Job], *, end: bool) -> tuple[list[Job], dict[int, str]]:
        """The queued jobs whose upstreams (``after:``) all satisfy them, and why each other one
        waits. With ``end``, a job whose upstream can no longer satisfy it ends CANCELED with
        the reason (``upstream job 12 FAILED``), and so do its own dependents, in this tick."""
        kept: list[Job] = queued
        waiting: dict[int, str] = {}
        for _ in range(64):  # each round ends the next generation of dependents
            upstreams = self.store.flows.upstreams()
            if not upstreams:
                return queued, {}
            kept, waiting, ended = [], {}, False
            for job in queued:
                ups = upstreams.get(job.id)
                said = verdict(ups) if ups else None
                if said is None or said.ready:
                    kept.append(job)
                elif said.doomed and end:
                    with contextlib.suppress(InvalidTransition, StoreError):
                        self.store.jobs.transition(job.id, JobState.CANCELED, reason=said.reason)
                        log.info("job %s: %s", job.id, said.reason)
                        ended = True
                else:
                    waiting[job.id] = said.reason
            if not ended:
                break
            again = {j.id for j in kept} | set(waiting)
            queued = [j for j in queued if j.id in again]
        return kept, waiting

    def _schedule(self) -> None:
        queued = self.store.jobs.list(states=[JobState.QUEUED])
        for job in queued:
            if job.cancel_requested:
                with contextlib.suppress(InvalidTransition, StoreError):
                    self.store.jobs.transition(job.id, JobState.CANCELED, reason=outcome.CANCELED)
        queued = [j for j in queued if not j.cancel_requested]
        queued, after = self._gate(queued, end=True)
        snap, by_id = self.snapshot(queued=queued)  # leaves out what was canceled
        totals = cluster_totals(snap.nodes)
        self._advance_usage(snap.now, snap.running, totals)
        if not snap.queued and not any(r.demand is not None for r in snap.running):
            self._autoscale(snap, Decisions())  # withdraws what was asked for
            self.waiting = after
            self._write_reasons()
            return
        began = time.perf_counter()
        # the same decisions as decide(snap), with the queue kept indexed between ticks
        decisions = self.scheduler.decide(snap)
        if self.decision_observer is not None:
            self.decision_observer(time.perf_counter() - began)
        for job_id, placements in decisions.starts:
            self.scheduler.removed(job_id)  # if it did not start after all, sync brings it back
            job = by_id[job_id]
            if self._start(job, placements):
                demand = Demand(len(placements), placements[0].cpus, len(placements[0].gpus))
                self.usage.charge_start(job.owner, cost_rate(demand, *totals))
        for pre in decisions.preemptions:
            self._preempt(pre.victim, pre.reason)
        for resize in decisions.resizes:
            self._resize(resize)
        notes = self._autoscale(snap, decisions)
        waiting = with_held_gpus(decisions.waiting, snap)
        self.waiting = {j: f"{r}; {notes[j]}" if j in notes else r for j, r in waiting.items()}
        self.waiting |= after
        self._write_reasons()

    def _autoscale(self, snap: Snapshot, decisions: Decisions) -> dict[int, str]:
        """Ask the cluster's autoscaler for the nodes waiting jobs lack, when the executor has
        one (:mod:`~trainhouse.scheduler.capacity`); what each job asked for waits for."""
        request = getattr(self.executor, "request_capacity", None)
        launchable = getattr(self.executor, "launchable", None)
        if not callable(request) or not callable(launchable):
            return {}
        try:
            types, cap = launchable()
            return dict(request(capacity.wants(snap, decisions, types, max_workers=cap)))
        except Exception:  # the queue goes on without new nodes
            log.exception("asking the autoscaler for nodes failed")
            return {}

    def _write_reasons(self) -> None:
        # the store keeps each waiting job's reason too, but a queue of thousands shifts its
        # positions at every start: write only reasons that changed beyond the position,
        # a bounded number per tick (readers take the live ones from `waiting`)
        written = 0
        for job_id, reason in self.waiting.items():
            gist = reason.split(": ", 1)[-1]
            if self._reasons.get(job_id) != gist and written < REASON_WRITES_PER_TICK:
                self._reasons[job_id] = gist
                self.store.jobs.update(job_id, reason=reason)
                written += 1

    def _preempt(self, job_id: int, reason: str) -> None:
        job = self.store.jobs.get(job_id)
        if job.state is not JobState.RUNNING or job.preempt_requested:
            return
        grace = float(job.spec.preemption_grace)
        self.store.jobs.update(job_id, preempt_requested=True, reason=reason)
        # the SDK's should_stop() turns true on every rank; SIGKILL only after the grace period
        self.executor.stop(job_id, grace=grace, reason=StopReason.PREEMPT, terminate=False)
        log.info("job %s: %s (grace %.0f s)", job_id, reason, grace)

    def _previous_world(self, job_id: int, number: int) -> int | None:
        """The world size of the attempt before ``number``, if it had one."""
        if number <= 1:
            return None
        try:
            before = self.store.jobs.attempt(job_id, number - 1)
        except StoreError:
            return None
        return sum(p.procs for p in before.placement) or None

    def _resize(self, resize: Resize) -> None:
        """Ask an elastic job to stop at a checkpoint; it starts again at its new size."""
        job = self.store.jobs.get(resize.job)
        if job.state is not JobState.RUNNING or job.preempt_requested or job.resize_requested:
            return
        if job.cancel_requested or job.prune_requested:
            return
        grace = float(job.spec.preemption_grace)
        self.store.jobs.update(resize.job, resize_requested=True, reason=resize.reason)
        self.store.jobs.add_event(resize.job, f"resize: {resize.reason}")
        # should_stop() turns true with the reason "resize"; SIGKILL only after the grace
        self.executor.stop(resize.job, grace=grace, reason=StopReason.RESIZE, terminate=False)
        log.info("job %s: %s (grace %.0f s)", resize.job, resize.reason, grace)

    def _start(self, job: Job, placements: Placements) -> bool:
        token = job_token(job.id)
        try:
            job, attempt = self.store.jobs.start_attempt(
                job.id, placement=placements, token_hash=hash_token(token)
            )
        except (InvalidTransition, StoreError) as exc:
            log.info("job %s not started: %s", job.id, exc)
            return False
        self._reasons.pop(job.id, None)
        files = JobLayout(self.home, job.id)
        workdir = files.attempt(attempt.number).workdir
        try:
            spec = job.spec
            # never through a link a previous attempt left on the way (that fails the start)
            jobfiles.remove(self.home, workdir)
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
                previous_world_size=self._previous_world(job.id, attempt.number),
            )
            request = envspec.request_for(
                spec.environment, self.env_defaults, f"{job.id}.{attempt.number}"
            )
            staging = self.store.datasets.stage_request(job.id)
            inputs = self.store.flows.resolve_inputs(job, attempt.number, self.store.models)
            if inputs:  # the models it reads are staged the way datasets are
                staging = StageRequest((*(staging.sources if staging else ()), *inputs))
            if staging is not None:
                staging = staging.with_cache("", self.dataset_cache_bytes)
            info = self.executor.launch(Launch(spec, placements, files, env, request, staging))
        except Exception as exc:  # whatever it was, the job must not stay RUNNING
            reason = f"could not start attempt {attempt.number}: {exc}"
            log.error("job %s: %s", job.id, reason)
            self.store.jobs.update_attempt(
                job.id,
                attempt.number,
                ended_at=time.time(),
                result=AttemptResult.FAILED,
                reason=reason,
            )
            self.store.jobs.transition(job.id, JobState.FAILED, reason=reason, exit_code=1)
            return False
        self._attempt_started[job.id] = time.time()
        self.store.jobs.update_attempt(
            job.id, attempt.number, pid=info.pid, pid_create_time=info.create_time
        )
        log.info("job %s attempt %s started (pid %s)", job.id, attempt.number, info.pid)
        return True
