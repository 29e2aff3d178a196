"""The ``trainhouse`` command line (typer): ``trainhouse --help`` lists the commands."""

from __future__ import annotations

from trainhouse.cli.app import app


def main() -> None:
    app()


__all__ = ["app", "main"]
