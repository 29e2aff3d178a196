"""Why an attempt failed, and whether restarting it can help.

A failure is either the job's own (``user``: a rank exited non-zero or crashed) or the
infrastructure's (``infra``: a rank was killed from outside, e.g. SIGKILL by a person or the
kernel's OOM killer, a node was lost, a rank vanished without recording its exit). The two are
counted apart: ``max_restarts`` bounds the job's own failures, the server's
``max_infra_restarts`` the others. Some failures cannot fix themselves (a syntax error, a missing
module, CUDA out of memory, a full disk): those match the spec's ``no_restart_on`` and fail the
job at once. Nor can an error that repeats: an attempt whose log ends in the same exception as
the previous failed attempt's (:func:`last_exception`, :func:`repeated`) is not restarted again.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace

from trainhouse.core.datasets import STAGING_FAILED_CODE, STAGING_FAILED_LINE, STAGING_RETRY_CODE
from trainhouse.core.envspec import BUILD_FAILED_CODE
from trainhouse.core.lifecycle import FailureKind
from trainhouse.core.records import Attempt
from trainhouse.core.spec import NoRestart
from trainhouse.executors.base import Exit
from trainhouse.jobfs.joblogs import read_log
from trainhouse.jobfs.layout import JobLayout

# signals that come from outside the process: the infrastructure's doing, not the code's
INFRA_SIGNALS = frozenset(
    int(s) for s in (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
)
TAIL_LINES = 20
#: restarts per job after infrastructure failures (``trainhouse server --max-infra-restarts``)
DEFAULT_MAX_INFRA_RESTARTS = 20
SCAN_BYTES = 256 * 1024
TRACEBACK_HEAD = "Traceback (most recent call last):"
EXCEPTION_CHARS = 500  # of the exception line quoted and compared
# a traceback's last line: the exception's (dotted) name, maybe ": its message"
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]{0,200}(?:: .*)?")
_NAMED = re.compile(r"[A-Za-z_][\w.]{0,200}(?:Error|Exception|Exit|Interrupt)(?:: .*)?")
# what differs between two attempts failing alike: their directories, object addresses
_ATTEMPT_DIR = re.compile(r"([/\\]attempts[/\\])\d+(?=[/\\])")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,16}\b")


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    rank: int | None  # the rank that failed first (None: the launcher, or no rank recorded)
    code: int  # its exit code; negative = killed by that signal
    summary: str  # "rank 1 was killed by signal 9 (SIGKILL)"
    log_tail: str  # the failing rank's last lines in this attempt
    permanent: str | None = None  # why restarting cannot help, if it cannot


def describe(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def attempt_log(files: JobLayout, rank: int | str, attempt: int) -> str:
    """The part of a rank's log that ``attempt`` wrote (logs append across attempts)."""
    data, _ = read_log(files.log(rank), within=files.home, tail=2000)
    text = data[-SCAN_BYTES:].decode(errors="replace")
    marker = f"=== trainhouse: attempt {attempt}"
    start = text.rfind(marker)
    if start >= 0:
        newline = text.find("\n", start)
        text = text[newline + 1 :] if newline >= 0 else ""
    return text


def _staging(ended: Exit, files: JobLayout) -> Failure | None:
    """A supervisor that could not stage a pinned dataset version: no rank started there. For
    good (a file changed, is missing, refused; a full disk): the job fails with the reason, which
    names the file; when it may pass (a timeout, a 5xx): an infrastructure failure, tried again."""
    if ended.exit_code not in (STAGING_FAILED_CODE, STAGING_RETRY_CODE) or not all(
        c < 0 for c in ended.rank_exit_codes.values()
    ):
        return None
    lines = attempt_log(files, "launcher", ended.attempt).rstrip().splitlines()
    why = next((ln for ln in reversed(lines) if STAGING_FAILED_LINE in ln), "")
    why = why.split(STAGING_FAILED_LINE, 1)[-1].lstrip(": ").strip()
    summary = "a dataset could not be staged" + (f": {why[:500]}" if why else "")
    tail = "\n".join(lines[-TAIL_LINES:])
    if ended.exit_code == STAGING_RETRY_CODE:
        return Failure(FailureKind.INFRA, None, ended.exit_code, summary, tail)
    return Failure(
        FailureKind.USER,
        None,
        ended.exit_code,
        summary,
        tail,
        permanent="the pinned version cannot be read as it was registered",
    )


def analyse(ended: Exit, files: JobLayout, ranks: int, policy: NoRestart) -> Failure:
    """Classify a failed attempt of ``ranks`` ranks (per node, for the local executor)."""
    rank = ended.failed_rank
    missing = [r for r in range(ranks) if str(r) not in ended.rank_exit_codes]
    if ended.exit_code == BUILD_FAILED_CODE and all(c < 0 for c in ended.rank_exit_codes.values()):
        # a supervisor could not build the job's environment: no rank started there (those of
        # other nodes were stopped), and the same requirements fail the same way again (the
        # next job with them tries anew)
        lines = attempt_log(files, "launcher", ended.attempt).rstrip().splitlines()
        tail = "\n".join(lines[-TAIL_LINES:])
        return Failure(
            FailureKind.USER,
            None,
            BUILD_FAILED_CODE,
            "the job's environment could not be built",
            tail,
            permanent="its requirements cannot be installed (fix them and submit again)",
        )
    staging = _staging(ended, files)
    if staging is not None:
        return staging
    if rank is not None:
        code = ended.rank_exit_codes[str(rank)]
        summary = f"rank {rank} {describe(code)}"
        log_text = attempt_log(files, rank, ended.attempt)
        kind = FailureKind.INFRA if code < 0 and -code in INFRA_SIGNALS else FailureKind.USER
    elif missing and ended.exit_code != 0:
        # a rank's wrapper itself was killed: it could not record anything
        code = ended.exit_code if ended.exit_code < 0 else -int(signal.SIGKILL)
        rank = missing[0]
        summary = f"rank {rank} vanished without an exit code (killed from outside)"
        log_text = attempt_log(files, rank, ended.attempt)
        kind = FailureKind.INFRA
    else:
        code = ended.exit_code
        summary = f"the launcher {describe(code)}"
        log_text = attempt_log(files, "launcher", ended.attempt)
        kind = FailureKind.INFRA if code < 0 and -code in INFRA_SIGNALS else FailureKind.USER
    lines = log_text.rstrip().splitlines()
    tail = "\n".join(lines[-TAIL_LINES:])
    permanent = None
    if kind is FailureKind.USER:
        if code in policy.exit_codes:
            permanent = f"exit code {code} is in no_restart_on.exit_codes"
        else:
            scanned = "\n".join(lines[-200:])
            for pattern in policy.log_patterns:
                found = re.search(pattern, scanned)
                if found is not None:
                    line = scanned[: found.end()].rsplit("\n", 1)[-1] + scanned[found.end() :]
                    line = line.split("\n", 1)[0].strip()
                    permanent = f"the log matches {pattern!r}: {line[:300]}"
                    break
    return Failure(kind, rank, code, summary, tail, permanent)


def last_exception(tail: str) -> str | None:
    """The exception the last Python traceback in ``tail`` (a rank's last lines) ended with,
    as its last line reads (``ValueError: bad lr``, at most :data:`EXCEPTION_CHARS`); None
    when the tail shows none. It is the first line after the last ``Traceback (most recent
    call last):`` that is not indented; a tail that lost the traceback's head (a deep stack)
    ends it at the last ``XxxError: ...`` line under an indented one. An attempt's directory
    in it reads ``attempts/*`` and an object's address ``0x?``: the same error in two
    attempts reads the same."""
    lines = tail.splitlines()
    found: str | None = None
    heads = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK_HEAD]
    if heads:
        for line in lines[heads[-1] + 1 :]:
            if line[:1].isspace() or not line.strip():
                continue
            if _EXCEPTION.fullmatch(line.rstrip()):
                found = line
            break
    else:
        for i in range(len(lines) - 1, 0, -1):
            if _NAMED.fullmatch(lines[i].rstrip()) and lines[i - 1][:1].isspace():
                found = lines[i]
                break
    if found is None:
        return None
    found = _ATTEMPT_DIR.sub(r"\1*", found.strip()[:EXCEPTION_CHARS])
    return _ADDRESS.sub("0x?", found)


def repeated(failure: Failure, previous: Attempt | None) -> Failure:
    """``failure`` marked permanent when it is the job's code failing with the same exception
    (:func:`last_exception`) as ``previous``, the job's last failed attempt before it: a
    deterministic error (a bad hparam) that one more restart would only repeat."""
    if failure.kind is not FailureKind.USER or failure.permanent is not None:
        return failure
    if previous is None or not previous.log_tail:
        return failure
    now = last_exception(failure.log_tail)
    if now is None or now != last_exception(previous.log_tail):
        return failure
    return replace(failure, permanent=f"the same error as attempt {previous.number} ({now})")
