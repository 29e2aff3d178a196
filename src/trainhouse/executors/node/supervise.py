"""Runs an attempt's launcher and records how it ended: ``python -m
trainhouse.executors.node.supervise [--cgroup DIR] EXIT_FILE COMMAND...``.

The local executor starts every attempt through this small process, the leader of the attempt's
session. It writes the launcher's exit code to ``EXIT_FILE`` as "CODE TIME" (negative: killed by
that signal), so a server that restarts while the attempt runs can re-adopt it and still learn its
result once it ends: the attempt is no longer the new server's child, so its exit status cannot be
waited for. SIGTERM and SIGINT are not forwarded: trainhouse signals the whole session, which
already reaches the launcher, and a second signal would cut the launcher's own clean-up short.

Nothing of the attempt outlives it. The supervisor is a child subreaper: a process of the attempt
whose parent ends (a daemon that double-forked, started a session of its own and dropped
``TRAINHOUSE_RUN_MARKER``) becomes the supervisor's child instead of init's, and once the
launcher has ended the supervisor kills every child it has left and reaps them. With
``--cgroup DIR`` (the local executor passes it where the machine allows,
:mod:`trainhouse.executors.node.cgroups`) the launcher starts in that cgroup, which the supervisor
kills and removes on its way out as well; a cgroup it cannot create or enter is reported in the
launcher's log and done without.

It is also non-dumpable (the attempt's processes cannot read its environment or memory), and
sets the umask of the attempt to :data:`~trainhouse.jobfs.hardening.PRIVATE_UMASK`: what the ranks
create is their user's alone.

A job that pins datasets gets them here first (``TRAINHOUSE_DATASETS``,
:mod:`trainhouse.executors.node.staging`): each version staged into the node's cache and held in
use until the attempt ends, ``TRAINHOUSE_DATASET_<KEY>`` set for the ranks. A version that cannot
be staged ends the attempt with :data:`~trainhouse.core.datasets.STAGING_FAILED_CODE` (or
:data:`~trainhouse.core.datasets.STAGING_RETRY_CODE` when it may pass), the reason last in the log.

A job with an ``environment:`` gets it here, before torchrun starts (``TRAINHOUSE_ENVIRONMENT``,
:mod:`trainhouse.core.envspec`): built once per node under the digest's lock or reused, with the
job's privileges, uv's output in the launcher's log; ``python`` in the entrypoint is then its
interpreter. A build that fails ends the attempt with
:data:`~trainhouse.core.envspec.BUILD_FAILED_CODE` (never restarted) and the resolver's message last
in the log. The job's processes can replace an exit record, so :func:`read_record` reads it through
:mod:`trainhouse.jobfs.jobfiles`. Imports the standard library and trainhouse's modules of the same
kind only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainhouse.core import envspec
from trainhouse.core.datasets import (
    STAGE_VAR,
    STAGING_FAILED_CODE,
    STAGING_FAILED_LINE,
    STAGING_RETRY_CODE,
    StageRequest,
)
from trainhouse.core.errors import DatasetError, EnvBuildError, StagingError
from trainhouse.executors.node import cgroups, envbuild
from trainhouse.executors.node.rank import record
from trainhouse.jobfs import hardening, jobfiles

MODULE = "trainhouse.executors.node.supervise"
USAGE = f"usage: python -m {MODULE} [--cgroup DIR] EXIT_FILE COMMAND [ARGS...]"
CLEANUP_TIMEOUT = 10.0  # seconds the supervisor spends killing what is left before it exits

#: an exit record is "CODE TIME": a longer one is not read
MAX_EXIT_RECORD = 4096


def read_record(path: Path, *, within: Path) -> tuple[int, float | None] | None:
    """The (code, time) :func:`~trainhouse.executors.node.rank.record` wrote, or None when there is
    none (yet), or when it is not a small regular file reached from ``within`` (the directory
    above the attempt's that the job cannot replace) without a link."""
    try:
        text = jobfiles.read_file(within, path, max_size=MAX_EXIT_RECORD).decode()
        code_text, _, time_text = text.strip().partition(" ")
        return int(code_text), float(time_text) if time_text else None
    except (OSError, ValueError):
        return None


def children(parent: int) -> list[int]:
    """The PIDs whose parent is ``parent`` (from ``/proc/<pid>/stat``, which anyone may read)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry))
    return found


def end_orphans(timeout: float = CLEANUP_TIMEOUT) -> int:
    """SIGKILL every child this process still has (orphans of the attempt it adopted as a
    subreaper, and their children as they become orphans in turn) and reap them, until it has
    none or ``timeout`` has passed; how many it killed."""
    me = os.getpid()
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        for pid in children(me):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return len(killed)  # no children left at all
            if pid == 0:
                break
        if time.monotonic() > deadline:
            return len(killed)
        time.sleep(0.02)


def _start(command: list[str], cgroup: Path | None) -> tuple[subprocess.Popen[bytes], Path | None]:
    """Start the launcher, in ``cgroup`` if one is given and can be made and entered; the
    launcher and the cgroup it runs in (None: none)."""
    if cgroup is not None:
        try:
            cgroup.mkdir(exist_ok=True)
            return (
                subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, preexec_fn=lambda: cgroups.enter(cgroup)
                ),
                cgroup,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            if not isinstance(exc, subprocess.SubprocessError) and cgroup.is_dir():
                raise  # the cgroup is there: the command itself cannot start
            print(
                f"trainhouse: cannot run the attempt in the cgroup {cgroup} ({exc}); its "
                "processes are found by their parent and marker instead",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(OSError):
                cgroup.rmdir()
    return subprocess.Popen(command, stdin=subprocess.DEVNULL), None


def _wait(child: subprocess.Popen[bytes]) -> int:
    """Wait for ``child``, reaping every other child (adopted orphans) that ends meanwhile."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for safety
            continue
        except ChildProcessError:  # pragma: no cover - someone else reaped it
            return child.wait()
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            return child.returncode


def _options(argv: list[str]) -> tuple[Path | None, list[str]]:
    """``--cgroup DIR`` if ``argv`` starts with it, and the arguments after it."""
    if argv[:1] == ["--cgroup"] and len(argv) > 1:
        return Path(argv[1]), argv[2:]
    return None, argv


def supervised(cmdline: list[str]) -> tuple[Path, Path | None] | None:
    """The exit file and the cgroup (None: none) of a supervisor's command line, as
    ``/proc/<pid>/cmdline`` shows it to anyone; None if it is not a supervisor's."""
    if len(cmdline) < 3 or cmdline[1:3] != ["-m", MODULE]:
        return None
    cgroup, rest = _options(cmdline[3:])
    return (Path(rest[0]), cgroup) if rest else None


def _say(line: str) -> None:
    print(line, flush=True)


class _Stopped(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _frame: object) -> None:
    raise _Stopped(signum)


def _environment(text: str) -> envbuild.Ready | None:
    """Set up the attempt's environment (None: it could not be built, and the log says why)."""
    try:
        request = envspec.Request.from_json(text)
    except (ValueError, TypeError) as exc:
        _say(f"{envspec.FAILED_LINE}: its request is unreadable ({exc})")
        return None
    source = request.requirements or request.pyproject or ", ".join(request.packages)
    _say(f"{envspec.SETTING_UP} ({envspec.redact(source)[:200]})")
    try:
        ready = envbuild.ensure(request, Path.cwd(), _say)
    except EnvBuildError as exc:
        _say(f"{envspec.FAILED_LINE}:\n{envspec.redact(str(exc))}")
        return None
    except Exception as exc:  # a cache it cannot write, uv missing: the job cannot start
        _say(f"{envspec.FAILED_LINE}: {type(exc).__name__}: {envspec.redact(str(exc))}")
        return None
    how = "built" if ready.built else "reused"
    _say(f"trainhouse: environment {ready.digest} ready in {ready.seconds:.2f} s ({how})")
    return ready


def _datasets(text: str) -> tuple[dict[str, str], list[Any]] | int:
    """Stage the job's pinned dataset versions: the ranks' variables and the versions held in
    use, or the exit code of a failure (the log says why)."""
    from trainhouse.executors.node import staging

    try:
        request = StageRequest.from_json(text)
    except (ValueError, TypeError, KeyError) as exc:
        _say(f"{STAGING_FAILED_LINE}: its request is unreadable ({exc})")
        return STAGING_FAILED_CODE
    try:
        return staging.stage(request, dict(os.environ), _say)
    except StagingError as exc:
        _say(f"{STAGING_FAILED_LINE}: {exc}")
        return STAGING_RETRY_CODE if exc.transient else STAGING_FAILED_CODE
    except DatasetError as exc:
        _say(f"{STAGING_FAILED_LINE}: {exc}")
        return STAGING_FAILED_CODE
    except Exception as exc:  # a cache it cannot write, fsspec missing: this node cannot start
        _say(f"{STAGING_FAILED_LINE}: {type(exc).__name__}: {exc}")
        return STAGING_RETRY_CODE


def main(argv: list[str]) -> int:
    cgroup, argv = _options(argv)
    if len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    exit_file = Path(argv[0])
    hardening.no_dump()
    hardening.child_subreaper()
    os.umask(hardening.PRIVATE_UMASK)
    request = os.environ.pop(envspec.ENV_VAR, None)  # the index options stay here, non-dumpable
    wanted = os.environ.pop(STAGE_VAR, None)
    ready = None
    held: list[Any] = []
    if request or wanted:
        # stopped while setting up (canceled, preempted): the build (uv got the signal too)
        # ends here, as torchrun would have
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _stop)
        try:
            staged = _datasets(wanted) if wanted else ({}, [])
            if isinstance(staged, int):
                record(exit_file, staged)
                end_orphans()
                return staged
            os.environ.update(staged[0])
            held = staged[1]
            ready = _environment(request) if request else None
        except _Stopped as stopped:
            _say(f"trainhouse: stopped by signal {stopped.signum} while setting up the environment")
            for version in held:
                version.release()
            record(exit_file, -stopped.signum)
            end_orphans()
            return 128 + stopped.signum
        if request and ready is None:
            for version in held:
                version.release()
            record(exit_file, envspec.BUILD_FAILED_CODE)
            end_orphans()
            return envspec.BUILD_FAILED_CODE
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: None)
    if ready is not None:
        os.environ.update(ready.environ(dict(os.environ)))
    try:
        child, cgroup = _start(argv[1:], cgroup)
    except OSError as exc:
        print(f"trainhouse: cannot start {argv[1]!r}: {exc}", file=sys.stderr)
        code = 127
    else:
        code = _wait(child)
    record(exit_file, code)
    if cgroup is not None:
        cgroups.kill(cgroup)
    end_orphans()
    if ready is not None:
        ready.release()
    for version in held:
        version.release()
    if cgroup is not None:
        cgroups.remove(cgroup)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
