"""``trainhouse spec``: the job spec's JSON Schema, or a spec file checked and resolved.

Offline: no server is involved. The spec module (pydantic, YAML) loads when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainhouse.cli import render
from trainhouse.cli.render import errors, print_json

app = typer.Typer()  # merged into the root: its command is top-level


@app.command("spec")
def spec_cmd(
    file: Annotated[Path | None, typer.Argument(help="A spec file to validate")] = None,
    schema: Annotated[bool, typer.Option("--schema", help="Print the JSON Schema")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override key=value")] = None,
) -> None:
    """Print the job spec's JSON Schema, or validate a spec file and print it resolved."""
    from trainhouse.core.spec import json_schema, load_spec

    if schema:
        print_json(json_schema())
        return
    if file is None:
        render.fail("give a spec file to validate, or --schema", render.EXIT_BAD_INPUT)
    with errors():
        print_json(load_spec(file, set_ or []).model_dump(mode="json"))
