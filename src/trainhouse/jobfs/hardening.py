"""What the server and the attempts' supervisors do to keep their secrets and state to themselves
(standard library only; Linux, a no-op elsewhere).

Jobs run as the server's OS user, and the kernel lets a process read the ``/proc/<pid>/environ``
and ``mem`` of every *dumpable* process of its own user: a training script could read the
server's environment (``TRAINHOUSE_DB``, with its password) or memory by walking up its parents.
:func:`no_dump` makes the calling process non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``): the
kernel then refuses those files, ``ptrace`` and core dumps to every process without
``CAP_SYS_PTRACE``, and hands the process's ``/proc`` entries to root. ``cmdline``, ``stat`` and
``status`` stay world-readable, so no secret may ever be put in an argv. The flag is reset by
``execve``: the programs the process starts are dumpable again unless they call it themselves.

:func:`child_subreaper` makes orphans of the caller's descendants its children instead of
init's (``PR_SET_CHILD_SUBREAPER``), so a supervisor finds the processes that left its
session. :data:`PRIVATE_UMASK` is the umask of the server and its jobs, and
:func:`read_private_file` reads a secret from a file only its owner can read (``--db-file``).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "PRIVATE_UMASK",
    "STDIN",
    "child_subreaper",
    "is_dumpable",
    "no_dump",
    "private_umask",
    "read_private_file",
    "umask",
]

PRIVATE_UMASK = 0o077  # files 0600, directories 0700
STDIN = "-"  # read_private_file's name for standard input
MAX_SECRET_BYTES = 64 << 10

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int) -> int | None:
    """``prctl(option, arg, 0, 0, 0)``; None where there is no prctl or it failed."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result: int = libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
    except (OSError, AttributeError):
        return None
    return None if result < 0 else result


def no_dump() -> bool:
    """Make this process non-dumpable: other processes of its user can no longer read its
    environment or memory or trace it. True when the kernel agreed."""
    return _prctl(_PR_SET_DUMPABLE, 0) == 0


def is_dumpable() -> bool | None:
    """Whether this process is dumpable (None where it cannot be told)."""
    result = _prctl(_PR_GET_DUMPABLE, 0)
    return None if result is None else result != 0


def child_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants. True when the kernel agreed."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0


def umask() -> int:
    """This process's umask (read from ``/proc/self/status`` where it can be, so that no
    other thread ever sees it changed)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(PRIVATE_UMASK)
    os.umask(current)
    return current


@contextmanager
def private_umask() -> Iterator[None]:
    """:data:`PRIVATE_UMASK` while the block runs (what it creates is its user's alone), the
    umask before it afterwards (for commands that run inside another program, tests)."""
    before = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(before)


def read_private_file(name: str, what: str = "the file") -> str:
    """The text of the file ``name`` (``-``: standard input), stripped of surrounding
    whitespace: one secret, such as a database URL.

    Refused, with ValueError saying why: a regular file that its group or others may read or
    write (its secret would not be a secret; a writer could swap it), an empty one, one of more
    than one line or over 64 KiB. Standard input is read once and then replaced by
    ``/dev/null``, so nothing the process starts later inherits it; a pipe's mode says nothing
    and is not checked, a file systemd opened for it (``StandardInput=file:``) is.
    """
    shown = "standard input" if name == STDIN else name
    try:
        fd = os.dup(0) if name == STDIN else os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISREG(info.st_mode) and mode & 0o077:
            raise ValueError(
                f"{what} {shown} has mode {mode:04o}: its group or other users could read (or "
                f"change) the secret in it; make it readable by its owner only "
                f"(chmod 600 {name if name != STDIN else 'FILE'})"
            )
        data = b""
        while len(data) <= MAX_SECRET_BYTES and (chunk := os.read(fd, 1 << 16)):
            data += chunk
    except OSError as exc:
        raise ValueError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
        if name == STDIN:
            _stdin_to_devnull()
    if len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"{what} {shown} is larger than {MAX_SECRET_BYTES >> 10} KiB")
    try:
        text = data.decode().strip()
    except UnicodeDecodeError:
        raise ValueError(f"{what} {shown} is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{what} {shown} is empty")
    if "\n" in text:
        raise ValueError(f"{what} {shown} has more than one line; it must hold the value alone")
    return text


def _stdin_to_devnull() -> None:
    try:
        null = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return
    try:
        os.dup2(null, 0)
    except OSError:
        pass  # standard input stays what it was; it has been read to its end
    finally:
        os.close(null)
