"""Runs one rank of a job: ``python -m trainhouse.executors.rank ARGV...`` (started by torchrun).

Sends the rank's stdout and stderr to ``$TRAINHOUSE_LOG_DIR/rank-$RANK.log`` (appending across
attempts), forwards SIGTERM and SIGINT to the user's process, and writes the rank's exit code to
``$TRAINHOUSE_ATTEMPT_DIR/exit-rank-$RANK`` as "CODE TIME" (negative: killed by that signal),
so the rank that failed first can be told from the ranks torn down after it (the names are
:mod:`trainhouse.layout`'s). Imports the standard library only (and trainhouse's modules that
do), so it adds nothing to a rank's start-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainhouse.executors.supervise import record
from trainhouse.layout import ATTEMPT_DIR_ENV, ATTEMPT_ENV, LOG_DIR_ENV, AttemptLayout, log_name


def _argv(argv: list[str]) -> list[str]:
    # "python" in an entrypoint means the server's interpreter, which has torch and trainhouse
    if argv and Path(argv[0]).name in ("python", "python3", f"python3.{sys.version_info[1]}"):
        return [sys.executable, *argv[1:]]
    return argv


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m trainhouse.executors.rank COMMAND [ARGS...]", file=sys.stderr)
        return 2
    rank = os.environ.get("RANK", "0")
    log_dir = Path(os.environ.get(LOG_DIR_ENV, "."))
    attempt_dir = AttemptLayout(Path(os.environ.get(ATTEMPT_DIR_ENV, ".")))
    attempt = os.environ.get(ATTEMPT_ENV, "?")
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / log_name(rank)).open("ab", buffering=0) as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"=== trainhouse: attempt {attempt}, rank {rank}, {stamp} ===\n".encode())
        try:
            child = subprocess.Popen(
                _argv(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        except OSError as exc:
            log.write(f"trainhouse: cannot start {argv[0]!r}: {exc}\n".encode())
            code = 127
        else:

            def forward(signum: int, _frame: object) -> None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signum)

            signal.signal(signal.SIGTERM, forward)
            signal.signal(signal.SIGINT, forward)
            code = child.wait()
        record(attempt_dir.rank_exit(rank), code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
