"""The stop schedule both executors follow (trainhouse.executors.node.stopping)."""

from __future__ import annotations

import signal

from trainhouse.executors.node.stopping import KILL_AFTER_TERM, StopTimer
from trainhouse.lifecycle import StopReason


def test_a_job_told_to_stop_gets_its_grace_then_sigterm_then_sigkill() -> None:
    t = StopTimer()
    assert not t.requested and t.due(0.0) == []
    assert t.request(100.0, grace=30, reason=StopReason.CANCEL, terminate=False)
    assert t.reason is StopReason.CANCEL
    assert t.due(129.9) == []
    assert t.due(130.0) == [signal.SIGTERM]
    assert t.due(130.0 + KILL_AFTER_TERM - 0.1) == []  # SIGTERM is sent once
    assert t.due(130.0 + KILL_AFTER_TERM) == [signal.SIGKILL]
    # SIGKILL again every KILL_AFTER_TERM until the attempt is gone
    assert t.due(130.0 + 2 * KILL_AFTER_TERM) == [signal.SIGKILL]


def test_terminate_now_and_a_later_request_only_brings_the_stop_forward() -> None:
    t = StopTimer()
    assert t.request(0.0, grace=120, reason=StopReason.PREEMPT, terminate=False)
    # a slower request changes nothing, and the first reason stays
    assert not t.request(10.0, grace=300, reason=StopReason.MAX_RUNTIME, terminate=False)
    assert t.reason is StopReason.PREEMPT
    assert t.request(20.0, grace=10, reason=StopReason.SHUTDOWN, terminate=True)
    assert (t.term_at, t.kill_at) == (20.0, 30.0) and t.reason is StopReason.PREEMPT
    assert t.term_due(20.0) and not t.term_due(21.0)
    assert t.due(30.0) == [signal.SIGKILL]


def test_hasten_stops_a_gang_that_cannot_go_on() -> None:
    t = StopTimer()
    t.hasten(50.0)  # never asked to stop: SIGTERM now, SIGKILL soon
    assert (t.term_at, t.kill_at) == (50.0, 50.0 + KILL_AFTER_TERM)
    slow = StopTimer()
    slow.request(0.0, grace=600, reason=StopReason.CANCEL, terminate=False)
    slow.hasten(50.0)
    assert (slow.term_at, slow.kill_at) == (50.0, 50.0 + KILL_AFTER_TERM)
    assert slow.due(50.0) == [signal.SIGTERM]
