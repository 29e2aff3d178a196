"""``trainhouse artifacts JOB``: the files a job kept (``run.log_artifact``, MLflow's
``log_artifact``), listed with their sizes; ``--download PATH DIR`` fetches one file or a
directory of them, each checked to hold the bytes listed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from trainhouse.cli import options, render
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import ago, console, errors, print_json, shown

app = typer.Typer()  # merged into the root: its commands are top-level


@app.command()
def artifacts(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    download: Annotated[
        tuple[str, Path] | None,
        typer.Option(
            "--download",
            metavar="PATH DIR",
            help="Fetch the artifact PATH (a file, or a directory of them; '.' for all) into "
            "DIR, each file checked against its listed size",
        ),
    ] = None,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """A job's artifacts with their sizes; --download PATH DIR fetches a file or directory."""
    from trainhouse.jobfs.workdir import human_size

    if download is not None:
        _download(job_id, download[0], download[1], url, as_json)
        return
    with errors(), options.client(url) as c:
        data = c.artifacts(job_id)
    if as_json:
        print_json(data)
        return
    if not data["artifacts"]:
        console.print(f"job {job_id} has no artifacts yet")
    else:
        table = Table(box=None, header_style="bold")
        for col in ("PATH", "SIZE", "KIND", "WRITTEN"):
            table.add_column(col, overflow="fold")
        for a in data["artifacts"]:
            table.add_row(shown(a["path"]), human_size(a["size"]), a["kind"], ago(a["mtime"]))
        console.print(table, highlight=False)
    if data["skipped"]:
        render.err_console.print(
            f"{data['skipped']} entries left out: links, FIFOs, devices or hard-linked files "
            "are no artifacts",
            highlight=False,
        )
    if data["truncated"]:
        render.err_console.print("the listing stopped at its bound: not every file is shown")


def _download(job_id: int, path: str, dest: Path, url: str | None, as_json: bool) -> None:
    wanted = "" if path.strip() in (".", "/") else path
    with (
        errors(),
        options.client(url) as c,
        render.download_progress(f"job {job_id} artifacts", quiet=as_json) as progress,
    ):
        got = c.download_artifacts(job_id, wanted, dest, progress=progress)
    if as_json:
        print_json({"job_id": job_id, "paths": [str(p) for p in got]})
    else:
        for p in got:
            console.print(Text("downloaded ") + shown(str(p)), highlight=False)
