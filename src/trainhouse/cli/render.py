"""Shared output helpers: rich tables for people, JSON for scripts, errors without tracebacks."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from rich.console import Console

from trainhouse.errors import ClientError, ServerUnreachable, TrainhouseError

console = Console()
err_console = Console(stderr=True)

# exit codes of the CLI (submit also returns the job's own exit code when it fails)
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_CANCELED = 4


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
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
}


def state(s: str) -> str:
    return f"[{STATE_STYLE.get(s, 'white')}]{s}[/]"


def fmt_value(v: float | None) -> str:
    return "nan" if v is None else f"{v:.4g}"
