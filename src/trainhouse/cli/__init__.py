"""The ``trainhouse`` command line (typer): ``trainhouse --help`` lists the commands."""

from __future__ import annotations

import sys


def main() -> None:
    # httpx imports its own command line (httpx._main: the real click, pygments, rich's
    # progress bars and syntax highlighting) whenever they are installed, as typer and rich are
    # here: ~1/4 of `trainhouse ps`'s start. httpx falls back to a stub `httpx.main` when that
    # import fails; this process never runs httpx's command line, so it makes it fail.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    try:
        from trainhouse.cli.app import app

        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
