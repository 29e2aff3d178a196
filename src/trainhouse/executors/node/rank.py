"""Runs one rank of a job: ``python -I -S .../executors/node/rank.py ARGV...`` (started by
torchrun with ``--no-python``, :func:`trainhouse.executors.node.torchrun.command`).

Sends the rank's stdout and stderr to ``$TRAINHOUSE_LOG_DIR/rank-$RANK.log`` (appending across
attempts) through a pipe it copies from, noting when each piece was written in the log's time index
``rank-$RANK.log.times`` (one 16-byte record per write: the byte offset where the piece starts in
the log and the wall time it arrived, ``<qd``; :mod:`trainhouse.jobfs.joblogs` reads it), so every
line's time is recorded as it is written, at the cost of one small write per piece and not per line.
It forwards SIGTERM and SIGINT to the user's process, and writes the rank's exit code to
``$TRAINHOUSE_ATTEMPT_DIR/exit-rank-$RANK`` as "CODE TIME" (negative: killed by that signal), so the
rank that failed first can be told from the ranks torn down after it (the names are
:mod:`trainhouse.jobfs.layout`'s; ``tests/unit/test_rank_wrapper.py`` keeps the copies here equal).

It runs before every rank, so it starts as little as it can: it imports a few modules of the
standard library and nothing of trainhouse, and torchrun starts it as a file with ``-I -S`` (no
``site``: no virtual environment, ``.pth`` files or editable installs to set up), about 10 ms
of interpreter instead of the 50 ms of ``python -m trainhouse.executors.node.rank``. Its own
environment is the rank's (the attempt's marker included), which the user's process inherits.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import struct
import subprocess
import sys
import time

# the names of trainhouse.jobfs.layout (this file imports nothing of trainhouse)
LOG_DIR_ENV = "TRAINHOUSE_LOG_DIR"
ATTEMPT_DIR_ENV = "TRAINHOUSE_ATTEMPT_DIR"
ATTEMPT_ENV = "TRAINHOUSE_ATTEMPT"
RANK_EXIT_PREFIX = "exit-rank-"
RANK_FINISHED_PREFIX = "finished-rank-"
PYTHON_ENV = "TRAINHOUSE_PYTHON"  # trainhouse.core.envspec.PYTHON_ENV


TIMES_SUFFIX = ".times"
TIME_RECORD = struct.Struct("<qd")  # (byte offset in the log, wall time)
PIECE = 1 << 16  # bytes copied from the pipe at a time
#: after the user's process exits, what its children still write is copied until the pipe
#: has been quiet this long (a daemon grandchild keeping it open never holds the rank up)
QUIET_AFTER_EXIT = 1.0
#: what libstdc++ prints when a thread of torch is unwound through code that may not throw: a
#: gloo worker thread that reaches for the GIL while the interpreter tears down (see
#: :func:`teardown_abort`)
TEARDOWN_ABORT = b"terminate called without an active exception"
TAIL = 512  # bytes of the rank's last output kept to look for it


def log_name(rank: str) -> str:
    return f"rank-{int(rank)}.log"


def times_name(rank: str) -> str:
    return log_name(rank) + TIMES_SUFFIX


class TimedLog:
    """A log file and its time index: each :meth:`write` appends the bytes and one record."""

    def __init__(self, log: int, times: int | None) -> None:
        self.log = log
        self.times = times
        # where the next write lands (the log is opened O_APPEND, and only this rank's wrapper
        # writes it while the attempt runs): its size once, then counted, no syscall per piece
        self.offset = os.fstat(log).st_size
        self.tail = b""  # the last TAIL bytes written

    def write(self, data: bytes) -> None:
        if not data:
            return
        self.tail = (self.tail + data[-TAIL:])[-TAIL:]
        at = self.offset
        view = memoryview(data)
        while view:  # a short write (a full disk) goes on with the rest
            written = os.write(self.log, view)
            self.offset += written
            view = view[written:]
        if self.times is not None:
            with contextlib.suppress(OSError):
                os.write(self.times, TIME_RECORD.pack(at, time.time()))


def copy(pipe: int, out: TimedLog, child: subprocess.Popen[bytes]) -> None:
    """Copy the pipe into ``out`` until every writer has closed it, or, once ``child`` has
    exited, until it stays quiet for :data:`QUIET_AFTER_EXIT` seconds."""
    quiet_since: float | None = None
    while True:
        ready, _, _ = select.select([pipe], [], [], 0.2)
        if ready:
            data = os.read(pipe, PIECE)
            if not data:
                return
            out.write(data)
            quiet_since = None
            continue
        if child.poll() is not None:
            now = time.monotonic()
            if quiet_since is None:
                quiet_since = now
            elif now - quiet_since > QUIET_AFTER_EXIT:
                return


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


def teardown_abort(code: int, rank: str, attempt_dir: str, tail: bytes) -> bool:
    """Whether a rank's SIGABRT is torch's abort in the interpreter's teardown after its run
    finished cleanly, which keeps its exit at 0.

    With torch 2.13 and gloo, a DDP module outlives the process group the SDK destroyed, and
    with it the group's worker threads; one that frees its last work (whose saved thread state
    holds a Python object) after the script has ended waits for the GIL, and when it gets it
    while the interpreter finalizes, CPython ends the thread by unwinding it through C++ code
    that may not throw: libstdc++ aborts the process. All three must hold: the rank was killed
    by SIGABRT, the SDK recorded that its run had finished cleanly
    (``finished-rank-N``, written after the group was left), and the rank's last output is
    libstdc++'s message for exactly that. Any other abort, or one before the record, stays a
    failure. (A job that writes the record itself gains nothing it could not get by exiting 0.)
    """
    if code != -signal.SIGABRT or TEARDOWN_ABORT not in tail:
        return False
    try:
        st = os.lstat(os.path.join(attempt_dir, f"{RANK_FINISHED_PREFIX}{rank}"))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode)


def _argv(argv: list[str]) -> list[str]:
    # "python" in an entrypoint means the job's environment's interpreter where it has one
    # (its supervisor set it up, trainhouse.core.envspec), else the server's: both have torch and
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
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    log_fd = os.open(os.path.join(log_dir, log_name(rank)), flags, 0o666)
    try:
        times_fd: int | None = os.open(os.path.join(log_dir, times_name(rank)), flags, 0o666)
    except OSError:
        times_fd = None  # the log goes on without times
    out = TimedLog(log_fd, times_fd)
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        out.write(f"=== trainhouse: attempt {attempt}, rank {rank}, {stamp} ===\n".encode())
        read_end, write_end = os.pipe()
        try:
            child = subprocess.Popen(
                _argv(argv), stdin=subprocess.DEVNULL, stdout=write_end, stderr=subprocess.STDOUT
            )
        except OSError as exc:
            os.close(read_end)
            out.write(f"trainhouse: cannot start {argv[0]!r}: {exc}\n".encode())
            code = 127
        else:

            def forward(signum: int, _frame: object) -> None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signum)

            signal.signal(signal.SIGTERM, forward)
            signal.signal(signal.SIGINT, forward)
            os.close(write_end)
            write_end = -1
            try:
                copy(read_end, out, child)
            finally:
                os.close(read_end)
            code = child.wait()
            if teardown_abort(code, rank, attempt_dir, out.tail):
                out.write(
                    f"trainhouse: rank {rank} aborted in the interpreter's teardown after its run "
                    "had finished cleanly (torch's gloo worker threads outlive the script); its "
                    "exit is kept at 0\n".encode()
                )
                code = 0
        finally:
            if write_end >= 0:
                os.close(write_end)
        record(os.path.join(attempt_dir, f"{RANK_EXIT_PREFIX}{rank}"), code)
    finally:
        os.close(log_fd)
        if times_fd is not None:
            os.close(times_fd)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
