"""The ``trainhouse`` command line (typer): ``trainhouse --help`` lists the commands."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from trainhouse.cli.app import app

        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
