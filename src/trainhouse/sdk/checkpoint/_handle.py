"""A checkpoint being written in the background (``save(..., blocking=False)``)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

from trainhouse.core.errors import CheckpointError


def message_of(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    if isinstance(exc, CheckpointError):
        return str(exc)
    return f"{type(exc).__name__}: {str(exc)[-1000:]}"


def yield_to_training() -> None:
    """Lower the calling thread, and the threads it starts (they inherit it), to the lowest
    priority of its scheduling class (nice 19 on Linux: a fifteenth of a core beside a busy
    thread at nice 0 at the least, all of a free core), where the OS lets it.

    A background save's writer and its hash helper then take little from a training loop that
    keeps every core busy: beside torch's threads on every core a writer at the same priority
    left an OpenMP thread waiting for its core at every barrier while the others spun
    (``bench/checkpoint.py`` part 4: 0.15 of the loop's speed while a save was written). On
    free cores (a rank waiting for its peers, its data or its GPU) it writes at full speed.
    ``SCHED_IDLE`` would leave the loop alone entirely, but a loop whose threads spin between
    steps never leaves a core idle: its write took over a minute.
    """
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or refused: as it was
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class SaveHandle:
    """A checkpoint written in the background by ``save(..., blocking=False)``.

    ``wait()`` blocks until it is published and registered and returns its record (None on
    ranks other than the main one, for plain checkpoints); it raises CheckpointError if the write
    failed. ``done()`` tells without blocking. Both are local to the rank: use
    ``run.checkpoint.wait()`` (collective) to raise a failure on every rank.
    """

    def __init__(self, step: int, work: Callable[[], dict[str, Any] | None] | None) -> None:
        self.step = step
        self.record: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.reported = False
        self._thread: threading.Thread | None = None
        self._go = threading.Event()
        if work is not None:
            self._thread = threading.Thread(
                target=self._run, args=(work,), name=f"trainhouse-checkpoint-{step}", daemon=True
            )
            self._thread.start()

    def _release(self) -> None:
        """Let the writer go (once save() is about to return: the thread would otherwise hold
        the GIL while the caller waits to get out of save())."""
        self._go.set()

    def _run(self, work: Callable[[], dict[str, Any] | None]) -> None:
        self._go.wait()
        yield_to_training()
        try:
            self.record = work()
        except BaseException as exc:  # surfaced by wait() / the next save
            self.error = exc

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def _join(self, timeout: float | None = None) -> bool:
        self._go.set()
        if self._thread is not None:
            self._thread.join(timeout)
        return self.done()

    def failure(self) -> str | None:
        """The error message of a finished, failed save that nobody was told about yet."""
        if self.error is None or self.reported:
            return None
        self.reported = True
        return (
            f"the checkpoint of step {self.step} failed in the background: {message_of(self.error)}"
        )

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        if not self._join(timeout):
            raise TimeoutError(f"the checkpoint of step {self.step} is still being written")
        message = self.failure()
        if message is not None:
            raise CheckpointError(message) from self.error
        if self.error is not None:
            raise CheckpointError(message_of(self.error) or "") from self.error
        return self.record

    def __repr__(self) -> str:
        state = "done" if self.done() else "writing"
        return f"<SaveHandle step {self.step} {state}>"
