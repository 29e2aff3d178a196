"""Continuing and cloning jobs: ``resume`` and ``clone``.

Both queue a job on the server (``POST /jobs/{id}/resume``, ``/clone``) and then follow it as
``submit`` does (``--detach`` returns at once; the exit code is the job's result).
"""

from __future__ import annotations

from typing import Annotated

import typer

from trainhouse.cli import options
from trainhouse.cli.jobs import follow_job
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import errors

app = typer.Typer()  # merged into the root: its commands are top-level

Detach = Annotated[bool, typer.Option("--detach", "-d", help="Return once queued")]


@app.command()
def resume(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    detach: Detach = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Send a canceled or failed job back to the queue: the same job continues from its
    latest good checkpoint (refused with the reason when it has none), then follow it."""
    with errors(), options.client(url) as c:
        job = c.resume(job_id)
        follow_job(
            c,
            job,
            f"job [bold]{job_id}[/] ({job['name']}) is queued again: {job['reason']} "
            f"(resume {job['resumes']})",
            as_json=as_json,
            detach=detach,
        )


@app.command()
def clone(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a field: --set hparams.lr=0.1")
    ] = None,
    from_checkpoint: Annotated[
        str | None,
        typer.Option(
            "--from-checkpoint",
            metavar="STEP|latest",
            help="Start from a copy of this checkpoint of JOB (default: from the start)",
        ),
    ] = None,
    detach: Detach = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """A new job with JOB's code (no upload) and spec plus the --set overrides, optionally
    starting from a verified copy of one of JOB's checkpoints; then follow it."""
    if from_checkpoint is not None and not (
        from_checkpoint == "latest" or from_checkpoint.isdigit()
    ):
        raise typer.BadParameter(
            f"--from-checkpoint takes a step or 'latest', not {from_checkpoint!r}"
        )
    with errors(), options.client(url) as c:
        job = c.clone(job_id, overrides=set_ or [], from_checkpoint=from_checkpoint)
        start = (
            f"from job {job_id}'s checkpoint of step {job['cloned_step']}"
            if job.get("cloned_step") is not None
            else "from the start"
        )
        follow_job(
            c,
            job,
            f"cloned job {job_id} as job [bold]{job['id']}[/] ({job['name']}), starting {start}",
            as_json=as_json,
            detach=detach,
        )
