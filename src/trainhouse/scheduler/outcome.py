"""What an attempt's end means for its job: a pure function, like the policy.

:func:`outcome` takes the job as it was when its attempt ended, the executor's :class:`Exit`
and (for a failure) the analysis of it (:func:`trainhouse.scheduler.failures.analyse`), and
returns an :class:`Outcome`: how the attempt is recorded and where the job goes. The scheduler
loop only applies it. The rules, first match wins:

=====================================  ============  =========================================
the attempt ended ...                  attempt       the job
=====================================  ============  =========================================
after a cancel request                 canceled      CANCELED
after a search's prune request         pruned        COMPLETED (the trial ended early)
after a preemption request             preempted     PREEMPTED -> QUEUED
after a resize request (elastic)       resized       PREEMPTED -> QUEUED, no restart counted;
                                                     it starts again at the new size
without ever starting (unplaced)       unplaced      RESTARTING -> QUEUED, no restart counted
past its max_runtime                   failed        FAILED
because the server shut down           interrupted   RESTARTING -> QUEUED, no restart counted
with every rank exiting 0              completed     COMPLETED
otherwise: a failure                   failed        RESTARTING -> QUEUED while its budget
                                                     lasts (max_restarts for the code's
                                                     failures, max_infra_restarts for the
                                                     infrastructure's) and restarting can
                                                     help (no_restart_on, not the same
                                                     error as the last failed attempt's:
                                                     failures.repeated); else FAILED
=====================================  ============  =========================================

:func:`lost` is the outcome of an attempt no executor knows any more (an infrastructure
failure), and :func:`stop_reason` says why a running attempt must stop now, for the loop and
for the report route alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainhouse.core.lifecycle import AttemptResult, FailureKind, JobState, StopReason
from trainhouse.core.records import Job
from trainhouse.executors.base import Exit
from trainhouse.scheduler.failures import Failure

__all__ = ["AttemptEnd", "Outcome", "Stop", "lost", "needs_analysis", "outcome", "stop_reason"]

CANCELED = StopReason.CANCEL.text
INTERRUPTED = "the server stopped while it ran; it resumes on restart"
DETAIL_LINES = 5  # lines of the failing rank's log quoted in a failed job's reason


@dataclass(frozen=True)
class AttemptEnd:
    """How the attempt row is completed."""

    result: AttemptResult
    reason: str
    exit_code: int | None = None
    rank_exit_codes: dict[str, int] | None = None
    failure: FailureKind | None = None
    failed_rank: int | None = None
    log_tail: str | None = None

    def fields(self) -> dict[str, Any]:
        """The attempt row's columns this end writes (None: left as they are)."""
        values: dict[str, Any] = {"result": self.result, "reason": self.reason}
        for name in ("exit_code", "rank_exit_codes", "failure", "failed_rank", "log_tail"):
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        return values


@dataclass(frozen=True)
class Outcome:
    """Where an ended attempt leaves its job.

    ``state`` is where the job ends up: a terminal state, or QUEUED ``via`` RESTARTING or
    PREEMPTED. ``counters`` are the restart counters to set on the way (RESTARTING), and
    ``exit_code`` is the job's exit code when it ends.
    """

    attempt: AttemptEnd
    state: JobState
    reason: str
    via: JobState | None = None
    exit_code: int | None = None
    counters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Stop:
    """Why a running attempt must stop, and what the job is told."""

    reason: StopReason
    message: str


def stop_reason(job: Job, attempt_started: float | None, now: float) -> Stop | None:
    """Why ``job``'s running attempt (started at ``attempt_started``) must stop now, if it
    must: a cancel request, a preemption, or its max_runtime passed."""
    if job.cancel_requested:
        return Stop(StopReason.CANCEL, CANCELED)
    if job.prune_requested:
        return Stop(StopReason.PRUNE, StopReason.PRUNE.text)
    if job.preempt_requested:
        return Stop(StopReason.PREEMPT, job.reason or "preempted")
    if job.resize_requested:  # run.stop_reason: "resize: shrunk 4->2: job 17 (high) ..."
        return Stop(StopReason.RESIZE, f"{StopReason.RESIZE.value}: {job.reason or 'resized'}")
    limit = job.max_runtime
    if limit and attempt_started is not None and now - attempt_started > limit:
        return Stop(StopReason.MAX_RUNTIME, max_runtime_message(limit))
    return None


def max_runtime_message(limit: float) -> str:
    return f"{StopReason.MAX_RUNTIME.text}: ran longer than {int(limit)} s"


def exit_code_of(ended: Exit) -> int:
    """The attempt's exit code: the failing rank's, else the launcher's."""
    rank = ended.failed_rank
    return ended.rank_exit_codes[str(rank)] if rank is not None else ended.exit_code


def needs_analysis(job: Job, ended: Exit) -> bool:
    """Whether :func:`outcome` needs the failure analysis of ``ended`` (it failed on its own)."""
    if job.cancel_requested or job.prune_requested or job.preempt_requested:
        return False
    if job.resize_requested:
        return False
    if ended.requeue is not None:
        return False
    if ended.stop_reason in (StopReason.MAX_RUNTIME, StopReason.SHUTDOWN):
        return False
    return not (ended.exit_code == 0 and exit_code_of(ended) == 0)


def outcome(job: Job, ended: Exit, failure: Failure | None, *, max_infra_restarts: int) -> Outcome:
    """What ``ended`` (an attempt of ``job``) means; ``failure`` is its analysis, needed when
    :func:`needs_analysis` says so."""
    code = exit_code_of(ended)
    ranks = ended.rank_exit_codes
    if job.cancel_requested:
        return Outcome(
            AttemptEnd(AttemptResult.CANCELED, CANCELED, code, ranks),
            JobState.CANCELED,
            CANCELED,
            exit_code=code,
        )
    if job.prune_requested:  # however its processes ended: the search stopped it on purpose
        reason = job.reason or StopReason.PRUNE.text
        return Outcome(
            AttemptEnd(AttemptResult.PRUNED, reason, code, ranks),
            JobState.COMPLETED,
            reason,
            exit_code=code,
        )
    if job.preempt_requested:
        reason = job.reason or "preempted"
        return Outcome(
            AttemptEnd(AttemptResult.PREEMPTED, reason, code, ranks),
            JobState.QUEUED,
            reason,
            via=JobState.PREEMPTED,
        )
    if job.resize_requested:  # the scheduler's own stop: not a failure, not a restart
        reason = job.reason or StopReason.RESIZE.text
        return Outcome(
            AttemptEnd(AttemptResult.RESIZED, reason, code, ranks),
            JobState.QUEUED,
            reason,
            via=JobState.PREEMPTED,
        )
    if ended.requeue is not None:  # it never started: no restart is counted
        return Outcome(
            AttemptEnd(AttemptResult.UNPLACED, ended.requeue),
            JobState.QUEUED,
            ended.requeue,
            via=JobState.RESTARTING,
        )
    if ended.stop_reason is StopReason.MAX_RUNTIME:
        reason = max_runtime_message(job.spec.max_runtime or 0)
        return Outcome(
            AttemptEnd(AttemptResult.FAILED, reason, code, ranks),
            JobState.FAILED,
            reason,
            exit_code=code,
        )
    if ended.stop_reason is StopReason.SHUTDOWN:
        return Outcome(
            AttemptEnd(AttemptResult.INTERRUPTED, INTERRUPTED, code, ranks),
            JobState.QUEUED,
            INTERRUPTED,
            via=JobState.RESTARTING,
        )
    if ended.exit_code == 0 and code == 0:
        reason = "every rank exited 0"
        return Outcome(
            AttemptEnd(AttemptResult.COMPLETED, reason, code, ranks),
            JobState.COMPLETED,
            reason,
            exit_code=0,
        )
    if failure is None:
        raise ValueError(f"job {job.id}: attempt {ended.attempt} failed; analyse it first")
    reason = failure.summary + (
        f"; not restarted: {failure.permanent}" if failure.permanent else ""
    )
    end = AttemptEnd(
        AttemptResult.FAILED,
        reason,
        failure.code,
        ranks,
        failure=failure.kind,
        failed_rank=failure.rank,
        log_tail=failure.log_tail,
    )
    return _restart_or_fail(
        job,
        end,
        ended.attempt,
        failure.summary,
        kind=failure.kind,
        exit_code=failure.code if failure.code > 0 else 128 - failure.code,
        permanent=failure.permanent,
        detail="\n".join(failure.log_tail.splitlines()[-DETAIL_LINES:]),
        max_infra_restarts=max_infra_restarts,
    )


def lost(job: Job, reason: str, *, max_infra_restarts: int) -> Outcome:
    """A RUNNING job whose attempt no executor knows: its end was never recorded (an
    infrastructure failure, restarted from its checkpoint while the budget lasts)."""
    end = AttemptEnd(AttemptResult.LOST, reason, failure=FailureKind.INFRA)
    return _restart_or_fail(
        job,
        end,
        job.attempts,
        reason,
        kind=FailureKind.INFRA,
        exit_code=1,
        max_infra_restarts=max_infra_restarts,
    )


def _restart_or_fail(
    job: Job,
    end: AttemptEnd,
    attempt: int,
    summary: str,
    *,
    kind: FailureKind,
    exit_code: int,
    permanent: str | None = None,
    detail: str = "",
    max_infra_restarts: int,
) -> Outcome:
    """After a failed attempt: restart from the latest checkpoint, if the budget allows."""
    infra = kind is FailureKind.INFRA
    if infra:
        used, limit, counter = job.infra_restarts, max_infra_restarts, "infra_restarts"
    else:
        used, limit, counter = job.restarts, job.spec.max_restarts, "restarts"
    if permanent is None and used < limit:
        reason = (
            f"attempt {attempt} failed ({summary}; {kind.label}); restart {used + 1} of {limit} "
            "from the latest checkpoint"
        )
        return Outcome(
            end, JobState.QUEUED, reason, via=JobState.RESTARTING, counters={counter: used + 1}
        )
    if permanent is not None:
        why = f"not restarted: {permanent}"
    elif infra:
        why = f"{limit} restarts after infrastructure failures used up (max_infra_restarts)"
    else:
        why = f"max_restarts ({limit}) used up" if limit else "max_restarts is 0"
    reason = f"attempt {attempt} failed: {summary}; {why}" + (
        f"; last lines:\n{detail}" if detail else ""
    )
    return Outcome(end, JobState.FAILED, reason, exit_code=exit_code or 1)
