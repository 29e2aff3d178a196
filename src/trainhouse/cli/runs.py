"""The commands about reading experiments: ``tag``, ``note``, ``project``, ``archive``,
``delete`` and ``compare`` (``ps --columns --where`` lists them: :mod:`trainhouse.cli.jobs`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from trainhouse.cli import options
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import console, errors, fail, fmt_value, print_json, shown

app = typer.Typer()  # merged into the root: its commands are top-level

JobArg = Annotated[int, typer.Argument(metavar="JOB")]


@app.command()
def tag(
    job_id: JobArg,
    tags: Annotated[
        list[str] | None,
        typer.Argument(help="Tags to add; -TAG (after --) or --remove TAG takes one off"),
    ] = None,
    remove: Annotated[
        list[str] | None, typer.Option("--remove", "-r", help="A tag to take off (repeatable)")
    ] = None,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Add tags to a job (or take them off); with none, print its tags."""
    add = [t for t in tags or [] if not t.startswith("-")]
    off = [*(remove or []), *(t[1:] for t in tags or [] if t.startswith("-"))]
    with errors(), options.client(url) as c:
        if add or off:
            now = c.set_tags(job_id, add=add, remove=off)
        else:
            now = c.job(job_id).get("tags") or []
    if as_json:
        print_json({"job_id": job_id, "tags": now})
        return
    console.print(f"job {job_id}: " + (", ".join(now) if now else "no tags"), highlight=False)


@app.command()
def note(
    job_id: JobArg,
    text: Annotated[
        str | None, typer.Argument(help="The note (markdown); '-' reads it from stdin")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Read the note from this file")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the note")] = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Set a job's note (markdown, shown on its page and by `show`); with no text, print it."""
    given = (text is not None) + (file is not None) + clear
    if given > 1:
        fail("give the note once: as TEXT, --file or --clear")
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read {file}: {exc}")
    elif text == "-":
        text = sys.stdin.read()
    elif clear:
        text = ""
    with errors(), options.client(url) as c:
        job = c.job(job_id) if text is None else c.set_note(job_id, text)
    if as_json:
        print_json({"job_id": job_id, "note": job.get("note")})
        return
    if text is None:
        console.print(job.get("note") or f"job {job_id} has no note", highlight=False, markup=False)
    else:
        console.print(f"job {job_id}: note {'cleared' if not text else 'saved'}")


@app.command()
def project(
    job_ids: Annotated[list[int], typer.Argument(metavar="JOB...")],
    name: Annotated[str, typer.Option("--to", help="The project they move to")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Move jobs to another project (the runs table filters by it)."""
    done = []
    with errors(), options.client(url) as c:
        for job_id in job_ids:
            done.append(c.set_project(job_id, name))
            if not as_json:
                console.print(f"job {job_id} is now in project {name}", highlight=False)
    if as_json:
        print_json([{"job_id": j["id"], "project": j["project"]} for j in done])


@app.command()
def archive(
    job_ids: Annotated[list[int], typer.Argument(metavar="JOB...")],
    undo: Annotated[bool, typer.Option("--undo", help="Bring them back to the list")] = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Archive ended jobs: kept, but left out of `ps` and the job list (`ps --archived`)."""
    done = []
    with errors(), options.client(url) as c:
        for job_id in job_ids:
            done.append(c.archive(job_id, archived=not undo))
            if not as_json:
                console.print(f"job {job_id} {'unarchived' if undo else 'archived'}")
    if as_json:
        print_json([{"job_id": j["id"], "archived": j["archived"]} for j in done])


@app.command()
def delete(
    job_ids: Annotated[list[int], typer.Argument(metavar="JOB...")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask")] = False,
    with_models: Annotated[
        bool,
        typer.Option(
            "--with-models",
            help="Also delete the model versions the jobs registered (their files are the "
            "jobs'); without it such a job is refused",
        ),
    ] = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Delete ended jobs for good: their logs, checkpoints, metrics and records."""
    if not yes:
        if not sys.stdin.isatty():
            fail("deleting is for good: pass --yes to confirm")
        typer.confirm(
            f"delete job(s) {', '.join(map(str, job_ids))} with their checkpoints, logs and "
            "metrics, for good?",
            abort=True,
        )
    from trainhouse.jobfs.workdir import human_size

    results = []
    with errors(), options.client(url) as c:
        for job_id in job_ids:
            result = c.delete(job_id, with_models=with_models)
            results.append(result)
            if not as_json:
                console.print(
                    f"job {job_id} deleted: {sum(result['rows'].values())} rows, "
                    f"{human_size(result['bytes_freed'])} of files",
                    highlight=False,
                )
    if as_json:
        print_json(results)


@app.command()
def compare(
    job_ids: Annotated[list[int], typer.Argument(metavar="JOB...")],
    last: Annotated[
        int,
        typer.Option("--last", "-n", min=1, help="The mean is of each series' last N points"),
    ] = 10,
    metric: Annotated[
        list[str] | None, typer.Option("--metric", "-m", help="Only this metric (repeatable)")
    ] = None,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Jobs side by side in numbers: per metric, each job's final value, best (lower or
    higher, by the metric's goal), min, max and the mean of its last N points."""
    with errors(), options.client(url) as c:
        data = c.compare(job_ids, last=last)
    if metric:
        data["metrics"] = [m for m in data["metrics"] if m["name"] in metric]
    if as_json:
        print_json(data)
        return
    if not data["metrics"]:
        console.print("these jobs have reported no metrics" + (" of those names" if metric else ""))
        return
    table = Table(box=None, header_style="bold")
    for col in ("METRIC", "JOB", "FINAL", "STEP", "BEST", "MIN", "MAX", f"MEAN(LAST {last})"):
        table.add_column(col, justify="left" if col in ("METRIC", "BEST") else "right")
    for m in data["metrics"]:
        goal = f" ({m['goal']}, by {m['goal_from']})" if m["goal"] else ""
        for i, r in enumerate(m["runs"]):
            table.add_row(
                shown(m["name"] + goal) if i == 0 else "",
                str(r["job_id"]),
                fmt_value(r["final"]),
                str(r["final_step"]),
                "-" if m["goal"] is None else fmt_value(r["best"]),
                fmt_value(r["min"]),
                fmt_value(r["max"]),
                fmt_value(r["last_mean"]),
            )
    console.print(table)
