"""The store's side of flows, on SQLite and PostgreSQL: what a queued job waits for (a deleted
upstream seen as deleted), a deleted job's links going with it, the inputs a job resolves
(again after a resume), promotions decided once (at start-up for one the previous server left
undecided), and an alias move waiting for a promotion that holds the model."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakes import FakeExecutor
from tests.support.records import new_job
from trainhouse.core.cluster import Placement
from trainhouse.core.errors import FlowError
from trainhouse.core.flows import Upstream
from trainhouse.core.lifecycle import JobState
from trainhouse.ingest import promotions
from trainhouse.scheduler.loop import SchedulerLoop
from trainhouse.store import BlobStore, Store

SPEC = {"entrypoint": "python t.py"}


def _run(store: Store, job_id: int, end: JobState) -> None:
    """QUEUED -> RUNNING -> ``end``."""
    store.jobs.start_attempt(job_id, placement=(Placement("n", 1, ()),), token_hash="x" * 64)
    store.jobs.transition(job_id, end, reason="test")


def _version(store: Store, job_id: int, value: float | None, name: str = "m") -> Any:
    step = len(store.models.for_job(job_id))  # each call another saved model of the job
    return store.models.add_version(
        name,
        owner="ann",
        job_id=job_id,
        attempt=1,
        step=step,
        path=f"models/{name}/step-{step:09d}",
        kind="export",
        files=[{"name": "model.json", "size": 5, "sha256": f"{job_id:x}{step:x}".rjust(64, "0")}],
        metrics={} if value is None else {"acc": value},
    )


def test_upstreams_of_queued_jobs_and_a_deleted_one(store: Store) -> None:
    a = new_job(store, spec=SPEC)
    b = new_job(store, spec={**SPEC, "after": [a]})
    c = new_job(store, spec={**SPEC, "after": [{"job": a, "when": "ended"}, b]})
    assert store.flows.upstreams() == {
        b: [Upstream(a, "completed", "QUEUED")],
        c: [Upstream(a, "ended", "QUEUED"), Upstream(b, "completed", "QUEUED")],
    }
    assert store.flows.dependents(a) == [b, c]
    _run(store, a, JobState.FAILED)
    store.runs.delete(a)
    assert store.flows.upstreams([b])[b] == [Upstream(a, "completed", None)]
    # a deleted dependent takes its links with it
    store.jobs.transition(b, JobState.CANCELED, reason="test")
    store.runs.delete(b)
    assert set(store.flows.upstreams()) == {c}
    assert store.flows.dependents(a) == [c]


def test_inputs_are_resolved_once_and_again_after_a_resume(store: Store, tmp_path: Path) -> None:
    train = new_job(store, spec=SPEC)
    _run(store, train, JobState.COMPLETED)
    reader = new_job(store, spec={**SPEC, "inputs": {"candidate": f"job:{train}"}})
    job = store.jobs.get(reader)
    with pytest.raises(FlowError, match=f"job {train} saved no model"):
        store.flows.resolve_inputs(job, 1, store.models)
    _version(store, train, 0.5)
    (source,) = store.flows.resolve_inputs(job, 1, store.models)
    assert (source.kind, source.pin.key, source.pin.ref) == ("model", "candidate", "m@1")
    _version(store, train, 0.6)  # saved later: an attempt that restarts reads what it read
    (again,) = store.flows.resolve_inputs(job, 2, store.models)
    assert again.pin.ref == "m@1"
    (pin,) = store.flows.inputs(reader)
    assert (pin.model, pin.version, pin.attempt, pin.ref) == ("m", 1, 1, f"job:{train}")
    assert store.flows.readers("m") == {1: [reader]}
    # a resume resolves again: an upstream rerun since may have saved anew
    _run(store, reader, JobState.FAILED)
    store.jobs.resume(reader, by="ann", checkpoint_step=None)
    assert store.flows.inputs(reader) == []
    (fresh,) = store.flows.resolve_inputs(store.jobs.get(reader), 3, store.models)
    assert fresh.pin.ref == "m@2"
    named = new_job(store, spec={**SPEC, "inputs": {"base": "m@champion"}})
    with pytest.raises(FlowError, match="input base: model 'm' has no alias 'champion'"):
        store.flows.resolve_inputs(store.jobs.get(named), 1, store.models)


def _promoting(store: Store, value: float | None) -> int:
    job = new_job(store, spec={**SPEC, "promote": {"alias": "champion", "metric": "acc"}})
    _version(store, job, value)
    _run(store, job, JobState.COMPLETED)
    return job


def test_a_promotion_is_decided_once_and_recorded(store: Store) -> None:
    first = _promoting(store, 0.5)
    made = promotions.decide(store, first)
    assert made is not None and made.promoted and made.decision is not None
    assert promotions.decide(store, first) is None  # decided already: nothing moves again
    worse = _promoting(store, 0.4)
    kept = promotions.decide(store, worse)
    assert kept is not None and kept.promoted is False
    assert (kept.version, kept.value, kept.previous_version, kept.previous_value) == (
        2,
        0.4,
        1,
        0.5,
    )
    assert store.models.get("m").aliases == {"champion": 1}
    missing = _promoting(store, None)
    refused = promotions.decide(store, missing)
    assert refused is not None and refused.promoted is False
    assert refused.decision == "m: not promoted: v3 has no value of acc to compare"
    assert [p.job_id for p in store.flows.promotions("m")] == [missing, worse, first]
    nothing = new_job(store, spec={**SPEC, "promote": {"alias": "champion", "metric": "acc"}})
    _run(store, nothing, JobState.COMPLETED)
    said = promotions.decide(store, nothing)
    assert said is not None and said.decision == (
        f"not promoted: job {nothing} registered no model version (run.save_model)"
    )
    entries, _ = store.accounts.audit_entries(actions=["model.promote", "model.promote.kept"])
    assert {e.actor for e in entries} == {f"job:{j}" for j in (first, worse, missing, nothing)}


def test_a_promotion_the_previous_server_left_undecided_is_decided_at_start_up(
    store: Store, tmp_path: Path
) -> None:
    job = _promoting(store, 0.7)  # COMPLETED, then the server died before deciding
    assert store.flows.undecided() == [job]
    loop = SchedulerLoop(
        store, BlobStore(tmp_path / "blobs"), FakeExecutor(), home=tmp_path, server_url="x"
    )
    loop.reconcile()
    assert store.flows.undecided() == []
    decided = store.flows.promotion(job)
    assert decided is not None and decided.promoted is True
    assert store.models.get("m").aliases == {"champion": 1}


def test_an_alias_move_waits_for_a_promotion_that_holds_the_model(
    store: Store, request: pytest.FixtureRequest
) -> None:
    """The promotion reads who holds the alias and moves it with the model locked: a manual
    move made meanwhile lands after it (and is the user's own, audited), never in between."""
    first = _promoting(store, 0.5)
    promotions.decide(store, first)
    second = _promoting(store, 0.9)  # v2, its promotion pending
    held, moved = threading.Event(), threading.Event()
    release = threading.Event()

    def promote() -> None:  # what promotions.decide does, paused while it holds the model
        with store.transaction() as conn:
            assert store.flows.claim(conn, second) is not None
            assert store.models.locked_aliases(conn, "m") == {"champion": 1}
            held.set()
            release.wait(30)
            store.models.set_alias("m", "champion", 2)

    def manual() -> None:
        held.wait(30)
        store.models.set_alias("m", "champion", 1)
        moved.set()

    threads = [threading.Thread(target=promote), threading.Thread(target=manual)]
    for t in threads:
        t.start()
    held.wait(30)
    # the manual move cannot land while the promotion holds the model
    assert not moved.wait(1.0)
    release.set()
    for t in threads:
        t.join(60)
    assert moved.is_set()
    assert store.models.get("m").aliases == {"champion": 1}  # the later move, after it
