"""The pure outcome of an attempt's end (trainhouse.scheduler.outcome): every rule of its table,
and properties over random ends (hypothesis), like the policy's tests."""

from __future__ import annotations

import itertools
import signal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainhouse.core.records import Attempt, Job
from trainhouse.executors.base import Exit
from trainhouse.lifecycle import (
    TRANSITIONS,
    AttemptResult,
    FailureKind,
    JobState,
    StopReason,
)
from trainhouse.scheduler.failures import Failure, last_exception, repeated
from trainhouse.scheduler.outcome import (
    Outcome,
    lost,
    needs_analysis,
    outcome,
    stop_reason,
)

INFRA = 20


def job(**kw: Any) -> Job:
    spec = {"entrypoint": "python train.py", **kw.pop("spec", {})}
    fields: dict[str, Any] = {
        "id": 7,
        "name": "j",
        "owner": "ann",
        "state": JobState.RUNNING,
        "priority": "normal",
        "spec_data": spec,
        "archive_sha256": "0" * 64,
        "created_at": 1.0,
        "updated_at": 1.0,
        "attempts": 1,
    }
    fields.update(kw)
    return Job(**fields)


def failure(kind: FailureKind = FailureKind.USER, code: int = 1, **kw: Any) -> Failure:
    return Failure(
        kind=kind,
        rank=kw.pop("rank", 0),
        code=code,
        summary=kw.pop("summary", f"rank 0 exited with code {code}"),
        log_tail=kw.pop("log_tail", "line 1\nline 2\nTraceback\nValueError: boom"),
        permanent=kw.pop("permanent", None),
    )


def decide(j: Job, ended: Exit, f: Failure | None = None) -> Outcome:
    return outcome(j, ended, f, max_infra_restarts=INFRA)


def test_every_rank_exiting_zero_completes() -> None:
    ended = Exit(7, 1, 0, {"0": 0, "1": 0})
    assert not needs_analysis(job(), ended)
    out = decide(job(), ended)
    assert (out.state, out.via, out.exit_code) == (JobState.COMPLETED, None, 0)
    assert out.attempt.result is AttemptResult.COMPLETED
    assert out.attempt.fields() == {
        "result": AttemptResult.COMPLETED,
        "reason": "every rank exited 0",
        "exit_code": 0,
        "rank_exit_codes": {"0": 0, "1": 0},
    }


def test_a_cancel_request_wins_over_everything() -> None:
    ended = Exit(7, 1, 1, {"0": 1}, StopReason.MAX_RUNTIME, requeue="unplaced")
    out = decide(job(cancel_requested=True, preempt_requested=True), ended)
    assert (out.state, out.via, out.reason) == (JobState.CANCELED, None, "canceled by request")
    assert out.attempt.result is AttemptResult.CANCELED and out.exit_code == 1


def test_a_preempted_attempt_goes_back_to_the_queue_with_its_reason() -> None:
    j = job(preempt_requested=True, reason="preempted for job 9 (high)")
    out = decide(j, Exit(7, 1, -15, {"0": -15}, StopReason.PREEMPT))
    assert (out.state, out.via) == (JobState.QUEUED, JobState.PREEMPTED)
    assert out.reason == "preempted for job 9 (high)" and not out.counters
    assert out.attempt.result is AttemptResult.PREEMPTED


def test_an_unplaced_attempt_is_requeued_without_a_restart() -> None:
    out = decide(job(), Exit(7, 1, 1, requeue="Ray could not place it"))
    assert (out.state, out.via, out.counters) == (JobState.QUEUED, JobState.RESTARTING, {})
    assert out.attempt.fields() == {
        "result": AttemptResult.UNPLACED,
        "reason": "Ray could not place it",
    }


def test_max_runtime_fails_the_job_whatever_the_exit_code() -> None:
    for code in (0, -15):
        out = decide(job(spec={"max_runtime": 30}), Exit(7, 1, code, {}, StopReason.MAX_RUNTIME))
        assert out.state is JobState.FAILED and out.exit_code == code
        assert out.reason == "max_runtime exceeded: ran longer than 30 s"


def test_a_server_shutdown_interrupts_and_requeues() -> None:
    out = decide(job(), Exit(7, 1, -15, {"0": -15}, StopReason.SHUTDOWN))
    assert (out.state, out.via, out.counters) == (JobState.QUEUED, JobState.RESTARTING, {})
    assert out.attempt.result is AttemptResult.INTERRUPTED


def test_a_failure_restarts_while_max_restarts_lasts_then_fails() -> None:
    ended = Exit(7, 2, 1, {"0": 1})
    assert needs_analysis(job(), ended)
    with pytest.raises(ValueError, match="analyse it first"):
        decide(job(), ended)
    out = decide(job(spec={"max_restarts": 2}, restarts=1), ended, failure())
    assert (out.state, out.via, dict(out.counters)) == (
        JobState.QUEUED,
        JobState.RESTARTING,
        {"restarts": 2},
    )
    assert "restart 2 of 2" in out.reason and "(rank 0 exited with code 1; failure)" in out.reason
    assert out.attempt.failure is FailureKind.USER and out.attempt.failed_rank == 0
    done = decide(job(spec={"max_restarts": 2}, restarts=2), ended, failure())
    assert done.state is JobState.FAILED and done.exit_code == 1
    assert "max_restarts (2) used up; last lines:\n" in done.reason
    assert done.reason.endswith("line 1\nline 2\nTraceback\nValueError: boom")


def test_infrastructure_failures_have_their_own_budget() -> None:
    ended = Exit(7, 1, -9, {"0": -9})
    kill = failure(FailureKind.INFRA, code=-9, summary="rank 0 was killed by signal 9 (SIGKILL)")
    out = decide(job(restarts=0), ended, kill)  # max_restarts 0 does not matter
    assert dict(out.counters) == {"infra_restarts": 1} and "infrastructure failure" in out.reason
    spent = decide(job(infra_restarts=INFRA), ended, kill)
    assert spent.state is JobState.FAILED
    assert spent.exit_code == 128 + signal.SIGKILL  # a signal's exit code, as a shell says it
    assert "restarts after infrastructure failures used up" in spent.reason


def test_a_permanent_failure_is_never_restarted() -> None:
    f = failure(code=2, permanent="exit code 2 is in no_restart_on.exit_codes")
    out = decide(job(spec={"max_restarts": 5}), Exit(7, 1, 2, {"0": 2}), f)
    assert out.state is JobState.FAILED and out.exit_code == 2
    assert "; not restarted: exit code 2" in out.attempt.reason


TRACEBACK = """step 3 loss 0.5
Traceback (most recent call last):
  File "/h/jobs/7/attempts/{n}/workdir/train.py", line 5, in <module>
    lr = float(run.hparams["lr"])
         ^^^^^^^^^^^^^^^^^^^^^^^^
ValueError: could not convert string to float: 'fast'
[W1206 ProcessGroup.cpp:123] Warning: destroy_process_group() was not called
"""


def test_the_last_exception_is_the_tracebacks_last_line() -> None:
    said = "ValueError: could not convert string to float: 'fast'"
    assert last_exception(TRACEBACK.format(n=1)) == said  # not the warning after it
    chained = (
        "Traceback (most recent call last):\n  File 'a.py'\nKeyError: 'x'\n\nDuring handling "
        "of the above exception, another exception occurred:\n\nTraceback (most recent call "
        "last):\n  File 'a.py', line 3\n    raise RuntimeError\nRuntimeError\n"
    )
    assert last_exception(chained) == "RuntimeError"
    # its head cut off by the tail (a deep stack): the named exception under an indented line
    assert last_exception('    f()\n  File "x.py", line 9\n    g()\nmod.BadThing: no\n') is None
    assert last_exception('  File "x.py", line 9\n    g()\ntorch.OutOfMemoryError: 2 GiB\n') == (
        "torch.OutOfMemoryError: 2 GiB"
    )
    # the same error in another attempt's directory, at another address, reads the same
    moved = (
        "Traceback (most recent call last):\n  x\nOSError: /h/attempts/{n}/w <obj at 0x7f{n}a2b3c4>"
    )
    assert last_exception(moved.format(n=1)) == last_exception(moved.format(n=2))
    assert last_exception(moved.format(n=1)) == "OSError: /h/attempts/*/w <obj at 0x?>"
    for none in ("", "just output\nexit 1\n", "Traceback (most recent call last):\n  x\n"):
        assert last_exception(none) is None
    huge = "Traceback (most recent call last):\n  x\nValueError: " + "v" * 1_000_000
    assert len(last_exception(huge) or "") == 500  # bounded, as quoted in the reason


def attempt(number: int, tail: str | None, result: AttemptResult = AttemptResult.FAILED) -> Attempt:
    return Attempt(job_id=7, number=number, started_at=1.0, result=result, log_tail=tail)


def test_the_same_error_twice_is_not_restarted_again() -> None:
    now = failure(log_tail=TRACEBACK.format(n=3))
    marked = repeated(now, attempt(2, TRACEBACK.format(n=2)))
    said = "ValueError: could not convert string to float: 'fast'"
    assert marked.permanent == f"the same error as attempt 2 ({said})"
    out = decide(job(spec={"max_restarts": 5}, restarts=1), Exit(7, 3, 1, {"0": 1}), marked)
    assert out.state is JobState.FAILED and out.exit_code == 1
    assert f"; not restarted: the same error as attempt 2 ({said}); last lines:\n" in out.reason
    assert out.reason.endswith("Warning: destroy_process_group() was not called")
    # another error, no earlier failure, no exception, or not the code's failure: unchanged
    other = TRACEBACK.format(n=2).replace("'fast'", "'slow'")
    assert repeated(now, attempt(2, other)) is now
    assert repeated(now, None) is now
    assert repeated(now, attempt(2, None)) is now
    plain = failure(log_tail="exit 1")
    assert repeated(plain, attempt(2, "exit 1")) is plain
    kill = failure(FailureKind.INFRA, code=-9, log_tail=TRACEBACK.format(n=3))
    assert repeated(kill, attempt(2, TRACEBACK.format(n=2))) is kill
    typo = failure(log_tail=TRACEBACK.format(n=3), permanent="exit code 2 is in no_restart_on")
    assert repeated(typo, attempt(2, TRACEBACK.format(n=2))).permanent == typo.permanent


def test_a_lost_attempt_is_an_infrastructure_failure() -> None:
    out = lost(job(attempts=3), "attempt 3 was lost", max_infra_restarts=INFRA)
    assert out.attempt.fields() == {
        "result": AttemptResult.LOST,
        "reason": "attempt 3 was lost",
        "failure": FailureKind.INFRA,
    }
    assert dict(out.counters) == {"infra_restarts": 1} and "attempt 3 failed" in out.reason
    gone = lost(job(infra_restarts=INFRA), "lost", max_infra_restarts=INFRA)
    assert gone.state is JobState.FAILED and gone.exit_code == 1


def test_stop_reason_serves_the_loop_and_the_report_route() -> None:
    assert stop_reason(job(), 0.0, 1e9) is None  # no max_runtime: never
    assert stop_reason(job(cancel_requested=True), None, 0).reason is StopReason.CANCEL  # type: ignore[union-attr]
    pre = stop_reason(job(preempt_requested=True, reason="for job 3"), None, 0)
    assert pre is not None and (pre.reason, pre.message) == (StopReason.PREEMPT, "for job 3")
    timed = job(spec={"max_runtime": 60})
    assert stop_reason(timed, 100.0, 159.0) is None
    late = stop_reason(timed, 100.0, 161.0)
    assert late is not None and late.reason is StopReason.MAX_RUNTIME
    assert late.message == "max_runtime exceeded: ran longer than 60 s"
    assert stop_reason(timed, None, 1e9) is None  # not started: nothing to measure


codes = st.integers(min_value=-15, max_value=3)


@st.composite
def ends(draw: st.DrawFn) -> tuple[Job, Exit, Failure]:
    ranks = draw(st.integers(min_value=1, max_value=4))
    rank_codes = {str(r): draw(codes) for r in range(ranks)}
    ended = Exit(
        7,
        1,
        draw(codes),
        rank_codes,
        draw(st.sampled_from([None, *StopReason])),
        requeue=draw(st.sampled_from([None, "could not place it"])),
    )
    j = job(
        spec={"max_restarts": draw(st.integers(0, 3)), "max_runtime": 60},
        restarts=draw(st.integers(0, 3)),
        infra_restarts=draw(st.integers(0, INFRA)),
        cancel_requested=draw(st.booleans()),
        preempt_requested=draw(st.booleans()),
    )
    f = failure(
        draw(st.sampled_from(list(FailureKind))),
        code=draw(codes.filter(lambda c: c != 0)),
        permanent=draw(st.sampled_from([None, "it cannot help"])),
    )
    return j, ended, f


@settings(max_examples=400, deadline=None)
@given(ends())
def test_every_outcome_is_a_legal_path_out_of_running(case: tuple[Job, Exit, Failure]) -> None:
    j, ended, f = case
    out = decide(j, ended, f if needs_analysis(j, ended) else None)
    path = [JobState.RUNNING, *([out.via] if out.via else []), out.state]
    for current, new in itertools.pairwise(path):
        assert new in TRANSITIONS[current], path
    # a job ends with an exit code; one that goes back to the queue does not
    assert (out.exit_code is not None) == out.state.terminal
    # a cancel always ends the job; COMPLETED needs every rank and the launcher at 0
    if j.cancel_requested:
        assert out.state is JobState.CANCELED
    if out.state is JobState.COMPLETED:
        assert ended.exit_code == 0 and all(c == 0 for c in ended.rank_exit_codes.values())
    # restarts are counted only after failures, one at a time, within their budget
    for counter, value in out.counters.items():
        assert out.attempt.result in (AttemptResult.FAILED, AttemptResult.LOST)
        before = j.restarts if counter == "restarts" else j.infra_restarts
        budget = j.spec.max_restarts if counter == "restarts" else INFRA
        assert value == before + 1 <= budget
    if out.attempt.result is AttemptResult.FAILED and out.via is not None:
        assert f.permanent is None  # nothing that cannot help is ever restarted
