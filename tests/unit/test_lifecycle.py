from __future__ import annotations

import itertools

import pytest

from trainhouse.errors import InvalidTransition
from trainhouse.lifecycle import RESUMABLE, TERMINAL, TRANSITIONS, JobState, check_transition


def test_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(JobState)


def test_terminal_states_have_no_exits_but_a_resume() -> None:
    assert RESUMABLE < TERMINAL
    for state in TERMINAL:
        assert TRANSITIONS[state] == (frozenset({JobState.QUEUED}) if state in RESUMABLE else set())
        assert state.terminal
    assert TRANSITIONS[JobState.COMPLETED] == frozenset()


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
        ("CANCELED", "QUEUED"),
        ("FAILED", "QUEUED"),
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


def test_failed_rank_is_the_first_to_fail() -> None:
    from trainhouse.executors.base import Exit

    # rank 1 crashed with 7; torchrun then tore rank 0 down with SIGTERM a moment later
    ended = Exit(1, 1, 1, {"0": -15, "1": 7}, rank_exit_times={"0": 101.0, "1": 100.0})
    assert ended.failed_rank == 1
    assert Exit(1, 1, 0, {"0": 0, "1": 0}).failed_rank is None
    assert Exit(1, 1, 1, {"0": 2, "1": 3}).failed_rank == 0
