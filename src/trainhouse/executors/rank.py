"""Runs one rank of a job: ``python -I -S .../trainhouse/executors/rank.py ARGV...`` (started by
torchrun with ``--no-python``, :func:`trainhouse.executors.torchrun.command`).

Sends the rank's stdout and stderr to ``$TRAINHOUSE_LOG_DIR/rank-$RANK.log`` (appending across
attempts), forwards SIGTERM and SIGINT to the user's process, and writes the rank's exit code to
``$TRAINHOUSE_ATTEMPT_DIR/exit-rank-$RANK`` as "CODE TIME" (negative: killed by that signal),
so the rank that failed first can be told from the ranks torn down after it (the names are
:mod:`trainhouse.layout`'s; ``tests/unit/test_rank_wrapper.py`` keeps the copies here equal).

It runs before every rank, so it starts as little as it can: it imports a few modules of the
standard library and nothing of trainhouse, and torchrun starts it as a file with ``-I -S`` (no
``site``: no virtual environment, ``.pth`` files or editable installs to set up), about 10 ms
of interpreter instead of the 50 ms of ``python -m trainhouse.executors.rank``. Its own
environment is the rank's (the attempt's marker included), which the user's process inherits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

# the names of trainhouse.layout (this file imports nothing of trainhouse)
LOG_DIR_ENV = "TRAINHOUSE_LOG_DIR"
ATTEMPT_DIR_ENV = "TRAINHOUSE_ATTEMPT_DIR"
ATTEMPT_ENV = "TRAINHOUSE_ATTEMPT"
RANK_EXIT_PREFIX = "exit-rank-"
PYTHON_ENV = "TRAINHOUSE_PYTHON"  # trainhouse.envs.PYTHON_ENV


def log_name(rank: str) -> str:
    return f"rank-{int(rank)}.log"


def record(path: str | os.PathLike[str], code: int) -> None:
    """Write "CODE TIME" to ``path`` atomically (a reader never sees half a line)."""
    directory, name = os.path.split(os.fspath(path))
    tmp = os.path.join(directory, f".{name}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(f"{code} {time.time():.6f}")
        os.replace(tmp, path)
    except OSError:
        pass


def _argv(argv: list[str]) -> list[str]:
    # "python" in an entrypoint means the job's environment's interpreter where it has one
    # (its supervisor set it up, trainhouse.envs), else the server's: both have torch and
    # trainhouse
    names = ("python", "python3", f"python3.{sys.version_info[1]}")
    if argv and os.path.basename(argv[0]) in names:
        return [os.environ.get(PYTHON_ENV) or sys.executable, *argv[1:]]
    return argv


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python rank.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    rank = os.environ.get("RANK", "0")
    log_dir = os.environ.get(LOG_DIR_ENV, ".")
    attempt_dir = os.environ.get(ATTEMPT_DIR_ENV, ".")
    attempt = os.environ.get(ATTEMPT_ENV, "?")
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, log_name(rank)), "ab", buffering=0) as log:
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
        record(os.path.join(attempt_dir, f"{RANK_EXIT_PREFIX}{rank}"), code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
