from __future__ import annotations

import itertools

import pytest

from trainhouse.errors import InvalidTransition
from trainhouse.scheduler.lifecycle import TERMINAL, TRANSITIONS, JobState, check_transition


def test_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(JobState)


def test_terminal_states_have_no_exits() -> None:
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
        assert state.terminal


@pytest.mark.parametrize(
    ("current", "new"),
    [
        ("QUEUED", "RUNNING"),
        ("RUNNING", "COMPLETED"),
        ("RUNNING", "FAILED"),
        ("RUNNING", "CANCELED"),
        ("RUNNING", "RESTARTING"),
        ("RESTARTING", "QUEUED"),
        ("RUNNING", "PREEMPTED"),
        ("PREEMPTED", "QUEUED"),
        ("QUEUED", "CANCELED"),
    ],
)
def test_allowed(current: str, new: str) -> None:
    assert check_transition(1, current, new) == JobState(new)


def test_every_disallowed_pair_raises_with_rule() -> None:
    for cur, new in itertools.product(JobState, JobState):
        if new in TRANSITIONS[cur]:
            continue
        with pytest.raises(InvalidTransition) as err:
            check_transition(7, cur, new)
        assert f"job 7 cannot go from {cur} to {new}" in str(err.value)


def test_restarting_and_preempted_go_back_to_queue() -> None:
    assert JobState.QUEUED in TRANSITIONS[JobState.RESTARTING]
    assert JobState.QUEUED in TRANSITIONS[JobState.PREEMPTED]
