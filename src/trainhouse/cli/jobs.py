"""The commands about jobs: ``submit`` (and ``submit --dry-run``), ``ps``, ``show``,
``cancel``, ``logs``, ``metrics`` and ``checkpoints``.

All of them talk to the server through the client (:func:`trainhouse.cli.options.client`); the
spec and workdir code (pydantic, YAML), rich's progress bars and the follower load only in the
commands that use them.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from trainhouse.cli import options, render
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import (
    EXIT_CANCELED,
    ago,
    console,
    duration,
    err_console,
    errors,
    exit_words,
    fmt_value,
    placement_words,
    print_json,
    state,
)
from trainhouse.core.lifecycle import TERMINAL

if TYPE_CHECKING:
    from trainhouse.client import Client

app = typer.Typer()  # merged into the root: its commands are top-level


def result_code(job: dict[str, Any]) -> int:
    """The exit code ``submit`` returns for a finished job."""
    if job["state"] == "COMPLETED":
        return 0
    if job["state"] == "CANCELED":
        return EXIT_CANCELED
    code = job.get("exit_code") or 1
    return code if 0 < code < 256 else 1


# -- submit ----------------------------------------------------------------------------------
@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="The job spec (YAML)")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a field: --set hparams.lr=0.1")
    ] = None,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return once queued")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say where it would run now, submit nothing")
    ] = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Upload the workdir and spec, then follow the job until it ends (Ctrl-C detaches).

    The exit code is the job's result: 0 completed, the job's exit code if it failed,
    4 if it was canceled. A spec with a search: block starts a search and follows its trials
    (--detach --json prints {"search_id": N, ...}).
    """
    if dry_run:
        _dry_run(file, set_ or [], as_json, url)
        return
    from trainhouse.core.spec import load_spec

    with errors():
        is_search = load_spec(file, set_ or []).search is not None
    if is_search:  # a spec with a search: block runs as a search of trial jobs
        from trainhouse.cli.search import submit_search

        submit_search(file, set_ or [], detach=detach, as_json=as_json, url=url)
        return
    with errors(), options.client(url) as c:
        job = c.submit(file, overrides=set_ or [])
        follow_job(
            c,
            job,
            f"submitted job [bold]{job['id']}[/] ({job['name']}) to {c.url}",
            as_json=as_json,
            detach=detach,
        )


def follow_job(c: Client, job: dict[str, Any], said: str, *, as_json: bool, detach: bool) -> None:
    """What ``submit`` (and ``resume``, ``clone``) do with the job they queued: say ``said``,
    then follow it until it ends (exit code = its result), or return at once (``detach``)."""
    from trainhouse.cli.follow import Follower

    if as_json and detach:
        print_json(job)
        return
    if not as_json:
        console.print(said, highlight=False)
    if detach:
        console.print(f"follow it with: trainhouse logs {job['id']} -f")
        return
    try:
        final = Follower(c, job["id"], out=err_console if as_json else console).run()
    except KeyboardInterrupt:
        console.print(
            f"\ndetached; job {job['id']} keeps running. "
            f"Follow it with `trainhouse logs {job['id']} -f`, stop it with "
            f"`trainhouse cancel {job['id']}`."
        )
        raise typer.Exit(0) from None
    if as_json:
        print_json(final)
    else:
        summary(final)
    raise typer.Exit(result_code(final))


def _dry_run(file: Path, overrides: list[str], as_json: bool, url: str | None) -> None:
    """``submit --dry-run``: where the job would run now, or why it would wait."""
    with errors(), options.client(url) as c:
        plan = c.dry_run(file, overrides=overrides)
    if as_json:
        print_json(plan)
        return
    console.print(
        plan["reason"].split(": ", 1)[-1] if not plan["would_start"] else plan["reason"],
        highlight=False,
    )
    if plan["preempts"]:
        jobs = ", ".join(str(j) for j in plan["preempts"])
        console.print(f"it would preempt job(s) {jobs}", highlight=False)


def summary(job: dict[str, Any]) -> None:
    """What ``submit`` (and ``demo``) print when the job has ended."""
    latest = job.get("latest_metrics") or {}
    shown = "  ".join(f"{k}={fmt_value(v)}" for k, v in sorted(latest.items()))
    console.print(f"job {job['id']} {state(job['state'])} after {job['attempts']} attempt(s)")
    if shown:
        console.print(f"  final metrics (step {job.get('last_step')}): {shown}", highlight=False)
    if job["state"] == "FAILED" and job.get("reason"):
        # its first line: the rest (the failing rank's last lines) was printed as it failed
        first = job["reason"].splitlines()[0]
        console.print(f"  reason: {first}", highlight=False, markup=False)
    where = job.get("job_dir")  # null unless the caller is an admin
    logs = f"   ({where}/logs)" if where else ""
    checkpoints = f"   ({where}/checkpoints)" if where else ""
    console.print(
        f"  metrics:     trainhouse metrics {job['id']}\n"
        f"  logs:        trainhouse logs {job['id']}{logs}\n"
        f"  checkpoints: trainhouse checkpoints {job['id']}{checkpoints}",
        highlight=False,
    )


# -- ps / show -------------------------------------------------------------------------------
@app.command()
def ps(
    all_: Annotated[bool, typer.Option("--all", "-a", help="Include ended jobs")] = False,
    columns: Annotated[
        str | None,
        typer.Option(
            "--columns",
            "-c",
            help="More columns: hparams.<key>, metrics.<series>.<last|min|max>, project, tag",
        ),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            "-w",
            help="A filter, such as 'metrics.val_loss.min < 0.1 and hparams.lr >= 1e-3 and "
            "state = COMPLETED' (ended jobs are listed too)",
        ),
    ] = None,
    sort: Annotated[
        str | None, typer.Option("--sort", help="Order by a field (such as metrics.loss.min)")
    ] = None,
    asc: Annotated[bool, typer.Option("--asc", help="Smallest first (default: largest)")] = False,
    project: Annotated[str | None, typer.Option("--project", help="Only this project")] = None,
    tag: Annotated[
        list[str] | None, typer.Option("--tag", help="Only jobs with this tag (repeatable)")
    ] = None,
    archived: Annotated[
        bool, typer.Option("--archived", help="Archived jobs too (they are left out)")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", help="At most this many jobs")] = 1000,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """List jobs (queued and running; --all or --where for ended ones too)."""
    chosen = [c.strip() for c in (columns or "").split(",") if c.strip()]
    with errors(), options.client(url) as c:
        jobs = c.jobs(
            all=all_,
            where=where,
            columns=[k for k in chosen if k.startswith(("hparams.", "metrics."))] or None,
            sort=sort,
            order="asc" if asc else ("desc" if sort else None),
            project=project,
            tags=tag,
            archived="include" if archived else "exclude",
            limit=limit,
        )
    if as_json:
        print_json(list(jobs))
        return
    if not jobs:
        ended = all_ or where is not None
        console.print("no jobs" + ("" if ended else " queued or running (--all shows ended ones)"))
        return
    table = Table(box=None, header_style="bold")
    heads = ["ID", "NAME", "OWNER", "STATE", "PRIORITY", "RANKS", "STEPS", "SUBMITTED"]
    heads += [k.upper() if "." not in k else k for k in chosen]
    for col in (*heads, "NOTE"):
        table.add_column(col, no_wrap=col != "NOTE", overflow="fold")
    for j in jobs:
        res = j["spec"].get("resources") or {"nodes": 1}
        ranks = res["nodes"] * (res.get("procs_per_node") or 1)
        step = "-" if j["last_step"] is None else str(j["last_step"] + 1)
        if j.get("total_steps"):
            step += f"/{j['total_steps']}"
        quiet = j["state"] in ("RUNNING", "COMPLETED")
        note = "" if quiet else (j.get("reason") or "").splitlines()[0]
        table.add_row(
            str(j["id"]),
            j["name"],
            j["owner"],
            state(j["state"]),
            j["priority"],
            str(ranks),
            step,
            ago(j["created_at"]),
            *(cell(j, k) for k in chosen),
            note,
        )
    console.print(table)


def cell(job: dict[str, Any], field: str) -> str:
    """A chosen column's value in ``ps``'s table ("-": none)."""
    if field == "tag" or field == "tags":
        return ",".join(job.get("tags") or []) or "-"
    value = job.get(field) if "." not in field else (job.get("values") or {}).get(field)
    if value is None:
        return "-"
    return fmt_value(value) if isinstance(value, float) else str(value)


@app.command()
def show(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """A job's state, attempts, exit codes, placement, and why it waits."""
    with errors(), options.client(url) as c:
        job = c.job(job_id)
    if as_json:
        print_json(job)
        return
    res = job["spec"]["resources"]
    console.print(f"[bold]job {job['id']}[/] {job['name']}  {state(job['state'])}")
    rows = [
        ("owner", job["owner"]),
        ("project", job.get("project") or "default"),
        ("tags", ", ".join(job.get("tags") or []) or "-"),
        ("priority", job["priority"]),
        ("entrypoint", job["spec"]["entrypoint"]),
        (
            "resources",
            f"{res['nodes']} node(s) x {res['procs_per_node']} rank(s), "
            f"{res['gpus_per_node']} GPU(s)/node, {res['cpus_per_proc']} CPU/rank",
        ),
        ("submitted", ago(job["created_at"])),
        (
            "ran for",
            duration((job["ended_at"] or time.time()) - job["started_at"])
            if job["started_at"]
            else "-",
        ),
        (
            "attempts",
            f"{job['attempts']} (restarts after failures of the code: {job['restarts']} of "
            f"{job['spec']['max_restarts']}; after infrastructure failures: "
            f"{job.get('infra_restarts', 0)})",
        ),
        (
            "progress",
            "-"
            if job["last_step"] is None
            else f"{job['last_step'] + 1} steps"
            + (f" of {job['total_steps']}" if job["total_steps"] else ""),
        ),
        *([("environment", job["environment"])] if job.get("environment") else []),
        ("placement", placement_words(job["placement"])),
        ("checkpoints", str(job["checkpoints"])),
        ("directory", job.get("job_dir") or "-"),  # null unless the caller is an admin
    ]
    if job.get("resumes"):
        rows.insert(7, ("resumed", f"{job['resumes']} time(s) after it ended"))
    if job.get("cloned_from") is not None:
        step = job.get("cloned_step")
        start = f"its checkpoint of step {step}" if step is not None else "the start"
        rows.append(("cloned from", f"job {job['cloned_from']}, starting from {start}"))
    if job.get("clones"):
        rows.append(("clones", ", ".join(f"job {c['id']} ({c['state']})" for c in job["clones"])))
    if job["exit_code"] is not None:
        rows.append(("exit code", exit_words(job["exit_code"])))
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, v)
    console.print(table, highlight=False)
    if job.get("reason"):
        label = "waiting" if job["state"] == "QUEUED" else "reason"
        console.print(f"[bold]{label}:[/] ", end="")
        console.print(job["reason"], highlight=False, markup=False)
    used = job.get("hparams")
    hparams = used if used is not None else job["spec"].get("hparams") or {}
    if hparams:
        label = "hparams" if used is not None else "hparams (the spec's; the run reported none)"
        console.print(f"[bold]{label}:[/] ", end="")
        console.print(
            "  ".join(f"{k}={json.dumps(v)}" for k, v in sorted(hparams.items())),
            highlight=False,
            markup=False,
        )
    if job.get("archived"):
        console.print("[bold]archived[/] (left out of the default list)")
    if job.get("note"):
        console.print("[bold]note:[/]")
        console.print(job["note"], highlight=False, markup=False)
    if job["latest_metrics"]:
        console.print(
            "[bold]latest metrics:[/] "
            + "  ".join(f"{k}={fmt_value(v)}" for k, v in sorted(job["latest_metrics"].items())),
            highlight=False,
        )
    if job["attempt_history"]:
        att = Table(title="attempts", box=None, header_style="bold", title_justify="left")
        for col in ("#", "STARTED", "DURATION", "RESULT", "EXIT", "FAILED RANK", "RANK EXIT CODES"):
            att.add_column(col, overflow="fold")
        att.add_column("REASON", overflow="fold", ratio=1)
        for a in job["attempt_history"]:
            codes = a["rank_exit_codes"] or {}
            result = a["result"] or "running"
            if a.get("failure"):
                result += " (infra)" if a["failure"] == "infra" else " (code)"
            att.add_row(
                str(a["number"]),
                ago(a["started_at"]),
                duration((a["ended_at"] or time.time()) - a["started_at"]),
                result,
                exit_words(a["exit_code"]),
                "-" if a.get("failed_rank") is None else str(a["failed_rank"]),
                " ".join(
                    f"{r}:{exit_words(c)}"
                    for r, c in sorted(codes.items(), key=lambda x: int(x[0]))
                )
                or "-",
                (a["reason"] or "").splitlines()[0] if a["reason"] else "",
            )
        console.print(att, highlight=False)
        for a in job["attempt_history"]:
            tail = a.get("log_tail") or ""
            if a["result"] == "failed" and tail:
                who = "rank " + str(a["failed_rank"]) if a.get("failed_rank") is not None else ""
                console.print(f"[bold]attempt {a['number']}, last lines of {who or 'the log'}:[/]")
                console.print(tail, highlight=False, markup=False)


# -- cancel ----------------------------------------------------------------------------------
@app.command()
def cancel(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    wait: Annotated[float, typer.Option(help="Seconds to wait for every process to end")] = 60,
    url: Url = None,
) -> None:
    """Stop a job and every process it started."""
    with errors(), options.client(url) as c:
        job = c.cancel(job_id)
        deadline = time.monotonic() + wait
        while job["state"] not in TERMINAL and (time.monotonic() < deadline):
            time.sleep(0.3)
            job = c.job(job_id)
    if job["state"] in TERMINAL:
        console.print(f"job {job_id} {state(job['state'])}")
    else:
        console.print(
            f"job {job_id} is stopping ({job['state']}); check `trainhouse show {job_id}`"
        )


# -- logs ------------------------------------------------------------------------------------
@app.command()
def logs(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines")] = False,
    rank: Annotated[
        str | None, typer.Option("--rank", help="Only this rank (or 'launcher')")
    ] = None,
    tail: Annotated[
        int | None, typer.Option("--tail", help="Only the last N lines (of each rank)")
    ] = None,
    timestamps: Annotated[
        bool, typer.Option("--timestamps", "-t", help="Start each line with when it was written")
    ] = False,
    grep: Annotated[
        str | None,
        typer.Option(
            "--grep", metavar="PATTERN", help="Only lines this regular expression matches"
        ),
    ] = None,
    url: Url = None,
) -> None:
    """Print a job's logs: every rank's, interleaved in the order they were written and
    prefixed with their rank, unless --rank is given; -f follows them live."""
    with errors(), options.client(url) as c:
        if follow:
            if timestamps:
                raise typer.BadParameter("--timestamps prints logs as written; not with -f")
            _follow_logs(c, job_id, rank, tail, grep)
            return
        if rank is None:
            ranks = c.log_ranks(job_id)["ranks"]
            rank = "all" if len(ranks) > 1 else "0"
        text, _, _ = c.logs(job_id, rank=rank, tail=tail, timestamps=timestamps, grep=grep)
        sys.stdout.write(text)
        sys.stdout.flush()


def _follow_logs(
    c: Client, job_id: int, rank: str | None, tail: int | None, grep: str | None = None
) -> None:
    """Stream the logs (Server-Sent Events) until the job ends; survives a server restart."""

    def reconnecting(exc: Exception) -> None:
        render.err_console.print(
            f"[yellow]lost the server ({exc}); reconnecting, nothing will be missed[/]",
            highlight=False,
        )

    res = c.job(job_id)["spec"]["resources"]
    prefix = rank is None and int(res["nodes"]) * int(res["procs_per_node"] or 1) > 1
    partial: dict[str, bool] = {}  # a rank's last text did not end its line
    pattern = re.compile(grep) if grep else None
    for event in c.stream_logs(
        job_id, ranks=[rank] if rank else None, tail=tail, on_reconnect=reconnecting
    ):
        if "end" in event:
            break
        text: str = event["text"]
        if prefix or pattern is not None:  # each line says whose it is; or only some lines
            lines = text.splitlines(keepends=True)
            out = []
            for ln in lines:
                cont = partial.get(event["rank"])
                if pattern is None or pattern.search(ln):
                    out.append(ln if cont or not prefix else f"[rank {event['rank']}] {ln}")
                partial[event["rank"]] = not ln.endswith("\n")
            text = "".join(out)
        sys.stdout.write(text)
        sys.stdout.flush()


# -- metrics / checkpoints -------------------------------------------------------------------
SUMMARY_POINTS = 1000  # points per series the metrics table reads (downsampled past that)


@app.command()
def metrics(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    name: Annotated[str | None, typer.Option("--name", help="Only this metric")] = None,
    all_ranks: Annotated[bool, typer.Option("--all-ranks", help="Per-rank values too")] = False,
    max_points: Annotated[
        int | None,
        typer.Option(
            "--max-points",
            min=0,
            help="At most N points per series, downsampled by the server keeping the first, "
            "last, smallest and largest values (0: all; the summary table uses 1000, --json all)",
        ),
    ] = None,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """The metrics a job reported: a summary per series (--json for every point)."""
    if max_points is None:
        # the summary's first, last, min and max survive downsampling; the count is the total
        max_points = 0 if as_json else SUMMARY_POINTS
    with errors(), options.client(url) as c:
        data = c.metrics(job_id, name=name, all_ranks=all_ranks, max_points=max_points)
    if as_json:
        print_json(data)
        return
    if not data["series"]:
        console.print(f"job {job_id} has reported no metrics yet")
        return
    table = Table(box=None, header_style="bold")
    for col in ("METRIC", "RANK", "POINTS", "STEPS", "FIRST", "LAST", "MIN", "MAX"):
        table.add_column(col)
    for s in data["series"]:
        pts = s["points"]
        vals = [p[1] for p in pts if p[1] is not None]
        table.add_row(
            s["name"],
            "job" if s["rank"] is None else str(s["rank"]),
            str(s.get("total_points", len(pts))),
            f"{pts[0][0]}..{pts[-1][0]}",
            fmt_value(pts[0][1]),
            fmt_value(pts[-1][1]),
            fmt_value(min(vals)) if vals else "nan",
            fmt_value(max(vals)) if vals else "nan",
        )
    console.print(table)


@app.command()
def checkpoints(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    download: Annotated[
        tuple[str, Path] | None,
        typer.Option(
            "--download",
            metavar="STEP DIR",
            help="Fetch the checkpoint of STEP ('latest' for the newest) into DIR, checking "
            "its digest (sha256 or blake3)",
        ),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Include deleted and corrupt checkpoints")
    ] = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """A job's checkpoints with step, size and digest; --download STEP DIR fetches one."""
    from trainhouse.jobfs.workdir import human_size

    if download is not None:
        _download(job_id, download[0], download[1], url, as_json)
        return
    with errors(), options.client(url) as c:
        data = c.checkpoints(job_id, all=all_)
    if as_json:
        print_json(data)
        return
    if not data["checkpoints"]:
        console.print(f"job {job_id} has no checkpoints yet")
        return
    # where they are (null unless the caller is an admin)
    table = Table(box=None, header_style="bold", title=data.get("directory"), title_justify="left")
    for col in ("STEP", "ATTEMPT", "SIZE", "DIGEST", "METRICS", "PATH", "SAVED"):
        table.add_column(col, overflow="fold")
    if all_:
        table.add_column("STATUS", overflow="fold")
    for ck in data["checkpoints"]:
        row = [
            str(ck["step"]),
            str(ck["attempt"]),
            human_size(ck["size"]),
            f"{ck.get('algorithm', 'sha256')}:{ck['sha256'][:16]}",
            " ".join(f"{k}={fmt_value(v)}" for k, v in sorted(ck["metrics"].items())),
            ck["path"] + ("/ (sharded)" if ck.get("kind") == "sharded" else ""),
            ago(ck["created_at"]),
        ]
        if all_:
            status = "deleted" if ck["deleted"] else "ok"
            row.append(f"corrupt: {ck['corrupt']}" if ck.get("corrupt") else status)
        table.add_row(*row)
    console.print(table, highlight=False)


def _download(job_id: int, step_text: str, dest: Path, url: str | None, as_json: bool) -> None:
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    if step_text == "latest":
        step = None
    else:
        try:
            step = int(step_text)
        except ValueError:
            render.fail(
                f"--download takes a step number or 'latest', got {step_text!r}",
                render.EXIT_BAD_INPUT,
            )
    with (
        errors(),
        options.client(url) as c,
        Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=render.err_console,
            transient=True,
            disable=as_json,
        ) as bar,
    ):
        task = bar.add_task(f"job {job_id} checkpoint", total=None)
        path = c.download_checkpoint(
            job_id,
            step,
            dest,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    if as_json:
        print_json({"job_id": job_id, "path": str(path)})
    else:
        console.print(f"downloaded to {path} (digest verified)", highlight=False)
