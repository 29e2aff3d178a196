"""A replica that fails restarts alone: what each rank of a service's job runs first
(``python -m trainhouse.serving.follow``, :func:`trainhouse.serving.follow.main`).

A service's replicas are the ranks of one torchrun job, and torchrun ends every rank when one
ends: were the replica the rank's process, one replica's crash (its model's code, out of
memory, a SIGKILL) would restart them all and the service would answer 503 meanwhile. So the
rank's process is this small supervisor, and the replica (``python -m trainhouse.serving.follow
--replica``) its child: when the child ends without being asked to, the supervisor starts it
again, after a pause that doubles with each restart (:data:`FIRST_PAUSE` up to
:data:`LONGEST_PAUSE`), and says so in the rank's log. Torchrun never sees it: the other
replicas keep serving, and the server sends the restarted one nothing until its calls say it is
ready again (:mod:`trainhouse.usecases.replicahub`).

A replica that keeps failing is not restarted forever: past :data:`RESTARTS` restarts within
:data:`WINDOW` seconds the supervisor ends with the child's exit code (1 for a clean exit), and
the job's own restart applies, as for any job whose rank fails.

SIGTERM and SIGINT (a stop: trainhouse signals the attempt's whole session; torchrun signals
the rank's process, which forwards them here) are passed to the child, once each, and end the
restarts: the supervisor ends with the child's code as it stopped. It imports the standard
library only: it stays small beside the replica it watches.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence

__all__ = ["FIRST_PAUSE", "LONGEST_PAUSE", "RESTARTS", "WINDOW", "supervise"]

RESTARTS = 5  # restarts within WINDOW seconds, past which the rank fails
WINDOW = 300.0
FIRST_PAUSE = 0.5  # seconds before the first restart; doubled for each restart in the window
LONGEST_PAUSE = 10.0


def supervise(
    argv: Sequence[str],
    *,
    restarts: int = RESTARTS,
    window: float = WINDOW,
    first_pause: float = FIRST_PAUSE,
    longest_pause: float = LONGEST_PAUSE,
    log: Callable[[str], None] | None = None,
) -> int:
    """Run ``argv`` and start it again each time it ends until a signal asks it to stop, or
    past ``restarts`` restarts within ``window`` seconds; the exit code of the rank (the
    child's, 128+N for a child killed by signal N)."""
    say = log or _say
    stopping: list[int] = []  # the signals received (forwarded to the child once each)
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        if signum in stopping:
            return
        stopping.append(signum)
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, forward)
    ended: deque[float] = deque()  # when each restarted child ended, within the window
    while True:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        for received in stopping:  # a signal that came while it was being started
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(received)
        code = child.wait()
        if stopping:
            return _exit_code(code)
        now = time.monotonic()
        while ended and now - ended[0] > window:
            ended.popleft()
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if len(ended) >= restarts:
            say(
                f"its process {child.pid} {how}: {restarts} restarts in {window:g} s already, "
                "so the replica fails (its job restarts)"
            )
            return _exit_code(code) or 1
        ended.append(now)
        pause = min(longest_pause, first_pause * 2 ** (len(ended) - 1))
        say(
            f"its process {child.pid} {how}; restarting it in {pause:g} s "
            f"(restart {len(ended)} of {restarts} allowed in {window:g} s)"
        )
        deadline = time.monotonic() + pause
        while not stopping and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        if stopping:
            return _exit_code(code)


def _exit_code(code: int) -> int:
    return code if code >= 0 else 128 - code


def _say(message: str) -> None:
    print(f"[replica {os.environ.get('RANK', '0')}] {message}", file=sys.stdout, flush=True)
