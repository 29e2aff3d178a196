"""Shared output helpers: rich tables for people, JSON for scripts, errors without tracebacks."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from trainhouse.core.errors import ClientError, ServerUnreachable, TrainhouseError

console = Console()
err_console = Console(stderr=True)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(name: str) -> Text:
    """A name a job chose (an artifact's path, a metric's name), as text: never rich markup
    (``[/]`` in it would fail the print), its control characters escaped (``\\x1b``): an ESC
    would reach the terminal as a control sequence."""
    return Text(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", name))


# exit codes of the CLI (submit also returns the job's own exit code when it fails)
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_CANCELED = 4


def fail(message: str, code: int = 1) -> NoReturn:
    from rich.markup import escape

    # a message's own brackets ("pip install 'trainhouse[onnx]'") are text, not markup
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def errors() -> Iterator[None]:
    """Turn trainhouse errors into one clear message and an exit code, never a traceback."""
    try:
        yield
    except ServerUnreachable as exc:
        fail(str(exc), EXIT_UNREACHABLE)
    except ClientError as exc:
        fail(str(exc), EXIT_BAD_INPUT if 400 <= exc.status < 500 else 1)
    except TrainhouseError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def ago(ts: float | None) -> str:
    if not ts:
        return "-"
    return duration(time.time() - ts) + " ago"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


STATE_STYLE = {
    "QUEUED": "yellow",
    "RUNNING": "cyan",
    "RESTARTING": "magenta",
    "PREEMPTED": "magenta",
    "COMPLETED": "green",
    "FAILED": "red",
    "CANCELED": "dim",
    "PRUNED": "dark_orange",
}


def state(s: str) -> str:
    return f"[{STATE_STYLE.get(s, 'white')}]{s}[/]"


def job_state(job: Mapping[str, Any]) -> str:
    """A job's state as listings show it: PRUNED for a search's trial its pruner stopped (the
    job is COMPLETED: it ended early on purpose), else its state."""
    if job["state"] == "COMPLETED" and job.get("prune_requested"):
        return "PRUNED"
    return str(job["state"])


def fmt_value(v: float | None) -> str:
    return "nan" if v is None else f"{v:.4g}"


def placement_words(placement: dict[str, Any] | None) -> str:
    """Where a job runs, in words: ``node-a: 2 ranks, 4 CPUs, GPUs 0,1; node-b: ...``."""
    nodes = (placement or {}).get("nodes") or []
    if not nodes:
        return "-"
    parts = []
    for p in nodes:
        procs, cpus, gpus = int(p.get("procs", 1)), int(p.get("cpus", 0)), p.get("gpus") or []
        text = f"{p.get('node', '?')}: {procs} rank{'s' if procs != 1 else ''}, "
        text += f"{cpus} CPU{'s' if cpus != 1 else ''}"
        if gpus:
            text += f", GPU{'s' if len(gpus) != 1 else ''} " + ",".join(str(g) for g in gpus)
        parts.append(text)
    return "; ".join(parts)


def most(size: object) -> int:
    """The largest value of a spec's size: ``4`` or an elastic ``"2:8"`` (8)."""
    if size is None:
        return 1
    return int(str(size).rsplit(":", 1)[-1])


def ranks(job: Mapping[str, Any]) -> str:
    """A job's ranks: where it runs, the ranks it has now; an elastic job's range after them
    (``4 (2:8)``)."""
    res = (job.get("spec") or {}).get("resources") or {}
    nodes = (
        ((job.get("placement") or {}).get("nodes") or []) if job.get("state") == "RUNNING" else []
    )
    if nodes:
        now = sum(int(p.get("procs", 1)) for p in nodes)
    else:
        now = most(res.get("nodes", 1)) * most(res.get("procs_per_node"))
    elastic = ":" in str(res.get("nodes", "")) or ":" in str(res.get("procs_per_node", ""))
    if not elastic:
        return str(now)
    least = int(str(res.get("nodes", 1)).split(":")[0]) * int(
        str(res.get("procs_per_node") or 1).split(":")[0]
    )
    return f"{now} ({least}:{most(res.get('nodes', 1)) * most(res.get('procs_per_node'))})"


def exit_words(code: int | None) -> str:
    """An exit code as people read it: a negative one (killed by a signal) names the signal
    (``SIGTERM``), as does 128+N from a shell; others stay numbers."""
    if code is None:
        return "-"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    if 128 < code < 160:
        try:
            return f"{code} ({signal.Signals(code - 128).name})"
        except ValueError:
            return str(code)
    return str(code)


def page_url(server_url: str, route: str) -> str:
    """The dashboard's page of a thing: ``http://HOST:PORT/#/jobs/7`` for ``route`` ``jobs/7``
    (a name in the route is quoted: ``services/digits%20v2``)."""
    from urllib.parse import quote

    return f"{server_url.rstrip('/')}/#/{quote(route, safe='/')}"


@contextmanager
def download_progress(
    what: str, *, quiet: bool = False
) -> Iterator[Callable[[int, int | None], None]]:
    """A transfer's progress bar on stderr (bytes, total, speed; gone once it ends, silent when
    ``quiet``, for --json): yields the ``progress(done, total)`` callback the client's downloads
    take."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err_console,
        transient=True,
        disable=quiet,
    ) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
