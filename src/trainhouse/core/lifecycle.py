"""The job state machine and the vocabulary of how attempts end: one transition table, one
function that checks it, and the enums every layer speaks.

::

    QUEUED ──► RUNNING ──► COMPLETED | FAILED | CANCELED
       ▲          │
       │          ├──► RESTARTING ──► QUEUED     (failed attempt with restarts left)
       │          └──► PREEMPTED  ──► QUEUED     (stopped to make room, resumes later)
       ├── CANCELED from QUEUED, RESTARTING or PREEMPTED
       └── QUEUED from CANCELED or FAILED: ``trainhouse resume``, the same job continuing
           from its latest checkpoint (the only way out of an ended state; COMPLETED has none)

Nothing else in trainhouse changes a job's state: the store calls :func:`check_transition`
inside the same transaction that writes the new state. The terminal set is spelled here once;
the CLI, the client and the dashboard (through ``/api/v1/states``) read it from here.

Standard library only: the SDK, the client and the CLI import this module too.
"""

from __future__ import annotations

from enum import StrEnum

from trainhouse.core.errors import InvalidTransition

__all__ = [
    "RESUMABLE",
    "TERMINAL",
    "TRANSITIONS",
    "AttemptResult",
    "FailureKind",
    "JobState",
    "StopReason",
    "check_transition",
]


class JobState(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    PREEMPTED = "PREEMPTED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def active(self) -> bool:
        """Holding (or about to hold) resources and processes."""
        return self is JobState.RUNNING


TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELED})
#: ended states a user may send back to the queue (``resume``); they stay terminal: nothing
#: runs and nothing of trainhouse moves them on its own
RESUMABLE = frozenset({JobState.FAILED, JobState.CANCELED})

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELED}),
    JobState.RUNNING: frozenset(
        {
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELED,
            JobState.RESTARTING,
            JobState.PREEMPTED,
        }
    ),
    JobState.RESTARTING: frozenset({JobState.QUEUED, JobState.CANCELED, JobState.FAILED}),
    JobState.PREEMPTED: frozenset({JobState.QUEUED, JobState.CANCELED}),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset({JobState.QUEUED}),  # resume
    JobState.CANCELED: frozenset({JobState.QUEUED}),  # resume
}


def check_transition(job_id: int, current: JobState | str, new: JobState | str) -> JobState:
    """Return ``new`` as a JobState if the table allows ``current -> new``, else raise."""
    cur, nxt = JobState(current), JobState(new)
    if nxt not in TRANSITIONS[cur]:
        allowed = ", ".join(sorted(TRANSITIONS[cur])) or "none (the job has ended)"
        raise InvalidTransition(
            f"job {job_id} cannot go from {cur} to {nxt}; allowed from {cur}: {allowed}"
        )
    return nxt


class AttemptResult(StrEnum):
    """How one attempt ended (the attempt row's ``result``)."""

    COMPLETED = "completed"  # every rank exited 0
    FAILED = "failed"  # a rank or the launcher failed, or the attempt could not start
    CANCELED = "canceled"  # stopped on request
    PREEMPTED = "preempted"  # stopped to make room; the job goes back to the queue
    INTERRUPTED = "interrupted"  # the server shut down while it ran; it resumes on restart
    UNPLACED = "unplaced"  # the executor could not place it; back to the queue, no restart
    LOST = "lost"  # no executor knew it any more (the server was down as it ended)
    PRUNED = "pruned"  # a search's pruner stopped the trial early; the job is COMPLETED
    RESIZED = "resized"  # an elastic job stopped at a checkpoint; it starts again at a new size


class FailureKind(StrEnum):
    """Whose failure a failed attempt was: restarts are counted apart for each."""

    USER = "user"  # the job's code: a rank exited non-zero or crashed
    INFRA = "infra"  # the infrastructure: a rank killed from outside, a lost node

    @property
    def label(self) -> str:
        return "infrastructure failure" if self is FailureKind.INFRA else "failure"


class StopReason(StrEnum):
    """Why trainhouse stops a running attempt (what an executor's ``stop`` is told)."""

    CANCEL = "cancel"  # a user canceled the job
    PREEMPT = "preempt"  # the scheduler makes room for a higher tier
    MAX_RUNTIME = "max_runtime"  # the job ran past its spec's max_runtime
    SHUTDOWN = "shutdown"  # the server is shutting down; the job resumes on restart
    PRUNE = "pruned"  # a search's pruner judged the trial unpromising (trainhouse.tune)
    RESIZE = "resize"  # an elastic job restarts from its checkpoint at another size

    @property
    def text(self) -> str:
        return _STOP_TEXT[self]


_STOP_TEXT = {
    StopReason.CANCEL: "canceled by request",
    StopReason.PREEMPT: "preempted",
    StopReason.MAX_RUNTIME: "max_runtime exceeded",
    StopReason.SHUTDOWN: "the server is shutting down",
    StopReason.PRUNE: "pruned",
    StopReason.RESIZE: "resized",
}
