"""The bounded pool of background work requests hand long reads to (``core/background.py``'s
``WorkPool``): at most its workers at once and its queue waiting, a 503 (ServerBusy with
Retry-After) past them, the same key joining the piece queued or running, and a stop that
refuses what waits and tells what runs to give up. Pieces block on events the test sets:
everything is ordered, nothing timed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from trainhouse.core.background import WorkPool
from trainhouse.core.errors import ServerBusy

GUARD = 60.0  # seconds before a wait fails the test rather than hangs it; never a measure


@pytest.fixture
def pool() -> Iterator[WorkPool]:
    made = WorkPool("test-work", workers=2, queue=3, retry_after=7.0)
    yield made
    made.stop()


def blocked(started: threading.Semaphore, release: threading.Event) -> Callable[..., str]:
    """A piece that says it started, then waits for ``release`` (or the pool's stop)."""

    def work(stopping: threading.Event) -> str:
        started.release()
        while not release.wait(0.01):
            if stopping.is_set():
                raise ServerBusy("given up")
        return "done"

    return work


def test_two_run_three_wait_and_the_next_is_refused_with_retry_after(pool: WorkPool) -> None:
    started, release = threading.Semaphore(0), threading.Event()
    futures = [pool.submit(i, f"piece {i}", blocked(started, release)) for i in range(5)]
    for _ in range(2):
        assert started.acquire(timeout=GUARD)
    assert pool.load() == (2, 3)
    assert not started.acquire(timeout=0.2)  # no third piece runs while two do
    with pytest.raises(ServerBusy) as refused:
        pool.submit(5, "piece 5", blocked(started, release))
    assert refused.value.retry_after == 7.0
    assert "2 running, 3 waiting" in str(refused.value) and "piece 5" in str(refused.value)
    release.set()
    assert [f.result(timeout=GUARD) for f in futures] == ["done"] * 5
    assert pool.load() == (0, 0)
    assert pool.submit(6, "piece 6", lambda _stop: 42).result(timeout=GUARD) == 42


def test_the_same_key_joins_the_piece_under_way(pool: WorkPool) -> None:
    started, release = threading.Semaphore(0), threading.Event()
    first = pool.submit("model", "registering", blocked(started, release))
    assert started.acquire(timeout=GUARD)
    again = pool.submit("model", "registering", lambda _stop: "a second read")
    assert again is first and pool.load() == (1, 0)
    release.set()
    assert again.result(timeout=GUARD) == "done"


def test_an_error_reaches_whoever_waits_and_frees_the_slot(pool: WorkPool) -> None:
    def fails(_stop: threading.Event) -> None:
        raise ValueError("unreadable")

    with pytest.raises(ValueError, match="unreadable"):
        pool.submit("bad", "reading", fails).result(timeout=GUARD)
    assert pool.submit("bad", "reading", lambda _stop: "again").result(timeout=GUARD) == "again"


def test_a_stop_refuses_what_waits_and_ends_what_runs(pool: WorkPool) -> None:
    started, release = threading.Semaphore(0), threading.Event()
    running = [pool.submit(i, "long", blocked(started, release)) for i in range(2)]
    waiting = pool.submit("w", "queued", blocked(started, release))
    for _ in range(2):
        assert started.acquire(timeout=GUARD)
    pool.stop(timeout=GUARD)
    for future in [*running, waiting]:
        with pytest.raises(ServerBusy):
            future.result(timeout=GUARD)
    with pytest.raises(ServerBusy, match="stopping"):
        pool.submit("late", "after the stop", lambda _stop: None)
