"""The job state machine: one transition table, one function that checks it.

::

    QUEUED ──► RUNNING ──► COMPLETED | FAILED | CANCELED
       ▲          │
       │          ├──► RESTARTING ──► QUEUED     (failed attempt with restarts left)
       │          └──► PREEMPTED  ──► QUEUED     (stopped to make room, resumes later)
       └── CANCELED from QUEUED, RESTARTING or PREEMPTED

Nothing else in trainhouse changes a job's state: the store calls :func:`check_transition`
inside the same transaction that writes the new state.
"""

from __future__ import annotations

from enum import StrEnum

from trainhouse.errors import InvalidTransition


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
    JobState.FAILED: frozenset(),
    JobState.CANCELED: frozenset(),
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
