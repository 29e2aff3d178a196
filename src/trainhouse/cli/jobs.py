"""The commands about jobs: ``submit`` (and ``submit --dry-run``), ``ps``, ``show`` and
``cancel``; what a job leaves behind (``logs``, ``metrics``, ``checkpoints``) is
:mod:`trainhouse.cli.outputs`.

All of them talk to the server through the client (:func:`trainhouse.cli.options.client`); the
spec and workdir code (pydantic, YAML), rich's progress bars and the follower load only in the
commands that use them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from trainhouse.cli import options, render
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import (
    EXIT_BAD_INPUT,
    EXIT_CANCELED,
    ago,
    console,
    duration,
    err_console,
    errors,
    exit_words,
    fail,
    fmt_value,
    job_state,
    page_url,
    placement_words,
    print_json,
    state,
)
from trainhouse.core.lifecycle import TERMINAL

if TYPE_CHECKING:
    from trainhouse.cli import fit
    from trainhouse.client import Client
    from trainhouse.client.records import Job, JobDetail

app = typer.Typer()  # merged into the root: its commands are top-level


def result_code(job: Job) -> int:
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
    file: Annotated[Path, typer.Argument(help="The job spec (YAML), or a flow file")],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a field: --set hparams.lr=0.1 (a flow: --set train.hparams.lr=0.1)",
        ),
    ] = None,
    after: Annotated[
        str | None,
        typer.Option(
            "--after",
            metavar="JOB[,JOB...]",
            help="Hold the job until these jobs have COMPLETED (after: in the spec)",
        ),
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
    (--detach --json prints {"search_id": N, ...}). A flow file (jobs: STEP: {spec: FILE,
    after: [...], inputs: {...}}) submits every step at once and follows them, a line each
    (--detach --json prints {"flow": ID, "jobs": {STEP: JOB, ...}}).
    """
    from trainhouse.core.spec.flowfile import is_flow

    try:
        text = file.read_text() if file.is_file() else ""
    except (OSError, UnicodeDecodeError):
        text = ""
    if is_flow(text):
        if after or dry_run:
            fail("--after and --dry-run are for a job spec; a flow's steps wait with after:")
        from trainhouse.cli.flows import submit_flow

        submit_flow(file, set_ or [], detach=detach, as_json=as_json, url=url)
        return
    if after:
        set_ = [*(set_ or []), _after_override(file, set_ or [], after)]
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


def _after_override(file: Path, overrides: list[str], after: str) -> str:
    """``--after 12,15`` as an override that adds those jobs to the spec's own ``after:``."""
    from trainhouse.core.spec import load_spec

    try:
        wanted = [int(part) for part in after.split(",") if part.strip()]
    except ValueError:
        fail(f"--after takes job ids separated by commas (12,15), got {after!r}")
    if not wanted:
        fail("--after names no job")
    with errors():
        spec = load_spec(file, overrides)
    have = [a.model_dump() for a in spec.after]
    named = {a["job"] for a in have}
    return "after=" + json.dumps(have + [{"job": j} for j in wanted if j not in named])


def follow_job(c: Client, job: Job, said: str, *, as_json: bool, detach: bool) -> None:
    """What ``submit`` (and ``resume``, ``clone``) do with the job they queued: say ``said``,
    then follow it until it ends (exit code = its result), or return at once (``detach``).

    The job exists from here on: a Ctrl-C at any point detaches (it may come while the
    follower's modules are still loading, which a job placed at once outruns)."""
    if as_json and detach:
        print_json(job)
        return
    try:
        if not as_json:
            console.print(said, highlight=False)
            page = page_url(c.url, f"jobs/{job['id']}")
            console.print(f"  dashboard: {page}", highlight=False, soft_wrap=True)
        if detach:
            console.print(f"follow it with: trainhouse logs {job['id']} -f")
            return
        from trainhouse.cli.follow import Follower

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
    if plan.get("shrinks"):
        jobs = ", ".join(str(j) for j in plan["shrinks"])
        console.print(f"it would shrink elastic job(s) {jobs} at a checkpoint", highlight=False)


def summary(job: JobDetail) -> None:
    """What ``submit`` (and ``demo``) print when the job has ended."""
    latest = job.get("latest_metrics") or {}
    shown = "  ".join(f"{k}={fmt_value(v)}" for k, v in sorted(latest.items()))
    console.print(f"job {job['id']} {state(job['state'])} after {job['attempts']} attempt(s)")
    if shown:
        console.print(f"  final metrics (step {job.get('last_step')}): {shown}", highlight=False)
    reason = job.get("reason")
    if job["state"] == "FAILED" and reason:
        # with the failing rank's last lines after its "last lines:" (the follower printed the
        # failure's first line only, so they are shown once, here at the end)
        first, *rest = reason.splitlines()
        console.print(f"  reason: {first}", highlight=False, markup=False)
        for line in rest:
            console.print(f"    {line}", highlight=False, markup=False)
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
            help="More columns: hparams.<key>, metrics.<series>.<last|min|max>, "
            "datasets.<key>, project, tag, note (your note; the scheduler's word is REASON)",
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
    """List jobs (queued and running; --all or --where for ended ones too).

    REASON is the scheduler's word on why a job waits or how it ended; NOTE (``-c note``) is
    the note you wrote (``trainhouse note``). Columns that do not fit the terminal are left
    out whole, and named under the table; ids, progress and numbers are never cut."""
    chosen = _chosen(columns)
    with errors(), options.client(url) as c:
        jobs = c.jobs(
            all=all_,
            where=where,
            columns=[k for k in chosen if k.startswith(("hparams.", "metrics.", "datasets."))]
            or None,
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
    from trainhouse.cli import fit  # what a table needs, once there are jobs to show

    fit.render(console, ps_columns(jobs, chosen))


def _chosen(columns: str | None) -> list[str]:
    """``--columns``' fields, each checked (an unknown one fails naming the fields there
    are), each once, in order."""
    from trainhouse.core.runquery import parse_field

    out: list[str] = []
    for raw in (columns or "").split(","):
        name = "tag" if raw.strip() == "tags" else raw.strip()
        if not name:
            continue
        try:
            name = str(parse_field(name))
        except ValueError as e:
            fail(f"--columns: {e}", EXIT_BAD_INPUT)
        if name not in out:
            out.append(name)
    return out


# how readily a column is left out when the terminal is narrow: the lowest rank goes first
_RANK = {"RANKS": 0, "PRIORITY": 1, "SUBMITTED": 2, "OWNER": 3, "REASON": 4, "NAME": 8, "STATE": 9}
_CHOSEN_RANK = 5  # the columns asked for outlast the default ones


def ps_columns(jobs: list[Job], chosen: list[str]) -> list[fit.Column]:
    """``ps``'s columns: the default ones, the ``chosen`` ones, then the scheduler's REASON
    (unless chosen where the user put it)."""
    from trainhouse.cli import fit

    heads = ["ID", "NAME", "OWNER", "STATE", "PRIORITY", "RANKS", "STEPS", "SUBMITTED"]
    cols = [
        fit.Column(h, keep=h in ("ID", "STEPS"), rank=_RANK.get(h, _CHOSEN_RANK)) for h in heads
    ]
    for k in chosen:
        head = k.upper() if "." not in k else k
        cols.append(fit.Column(head, wrap=k in ("note", "reason"), rank=_CHOSEN_RANK))
    if "reason" not in chosen:
        cols.append(fit.Column("REASON", wrap=True, rank=_RANK["REASON"]))
    for j in jobs:
        ranks = render.ranks(j)
        step = "-" if j["last_step"] is None else str(j["last_step"] + 1)
        if j.get("total_steps"):
            step += f"/{j['total_steps']}"
        reason = (j.get("reason") or "").splitlines()[0] if j.get("reason") else ""
        quiet = j["state"] in ("RUNNING", "COMPLETED") and not reason.startswith("staging")
        values: list[str | Text] = [
            str(j["id"]),
            j["name"],
            j["owner"],
            Text.from_markup(state(job_state(j))),
            j["priority"],
            ranks,
            step,
            ago(j["created_at"]),
            *(("" if quiet else reason) if k == "reason" else cell(j, k) for k in chosen),
        ]
        if "reason" not in chosen:
            values.append("" if quiet else reason)
        for col, value in zip(cols, values, strict=True):
            col.add(value)
    return cols


def cell(job: Job, field: str) -> str:
    """A chosen column's value in ``ps``'s table ("-": none); the note's first line."""
    if field == "tag" or field == "tags":
        return ",".join(job.get("tags") or []) or "-"
    if field == "note":
        note = (job.get("note") or "").strip()
        return note.splitlines()[0] if note else "-"
    value = job.get(field) if "." not in field else (job.get("values") or {}).get(field)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        from trainhouse.cli.fit import number

        return number(value)
    return str(value)


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
    console.print(f"[bold]job {job['id']}[/] {job['name']}  {state(job_state(job))}")
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
        *(
            [("datasets", "  ".join(f"{p['key']}={p['ref']} ({p['digest'][:12]})" for p in pins))]
            if (pins := job.get("datasets"))
            else []
        ),
        *([("staging", job["staging"])] if job.get("staging") else []),
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
    if job.get("flow_id") is not None:
        rows.append(("flow", f"{job['flow_id']}, step {job.get('flow_step')}"))
    if job.get("after"):
        rows.append(
            (
                "after",
                ", ".join(
                    f"job {a['job_id']} ({a['state'] or 'deleted'}"
                    + (", any end)" if a["when"] == "ended" else ")")
                    for a in job["after"]
                ),
            )
        )
    if job.get("inputs"):
        rows.append(
            (
                "inputs",
                "  ".join(
                    f"{i['key']}={i['model']}@{i['version']} ({i['ref']})" for i in job["inputs"]
                ),
            )
        )
    elif job["spec"].get("inputs"):
        rows.append(
            (
                "inputs",
                "  ".join(f"{k}={v}" for k, v in job["spec"]["inputs"].items()) + " (at start)",
            )
        )
    if (promotion := job.get("promotion")) is not None:
        rows.append(
            (
                "promotion",
                promotion["decision"]
                or f"pending: {promotion['alias']} by {promotion['metric']} ({promotion['mode']}) "
                "when it completes",
            )
        )
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
        for col in (
            "#",
            "STARTED",
            "DURATION",
            "RANKS",
            "RESULT",
            "EXIT",
            "FAILED RANK",
            "RANK EXIT CODES",
        ):
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
                str(
                    sum(int(p.get("procs", 1)) for p in (a.get("placement") or {}).get("nodes", []))
                ),
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
