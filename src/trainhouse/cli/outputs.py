"""What a job leaves behind, read from the command line: ``logs`` (and ``logs -f``),
``metrics`` and ``checkpoints`` (listing, and ``--download`` with a progress bar and its digest
checked). The commands that start and watch jobs are :mod:`trainhouse.cli.jobs`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from trainhouse.cli import options, render
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import (
    ago,
    console,
    errors,
    fmt_value,
    print_json,
)

if TYPE_CHECKING:
    from trainhouse.client import Client

app = typer.Typer()  # merged into the root: its commands are top-level


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
    prefix = rank is None and render.most(res["nodes"]) * render.most(res["procs_per_node"]) > 1
    lines = RankLines(prefix=prefix, pattern=re.compile(grep) if grep else None)
    for event in c.stream_logs(
        job_id, ranks=[rank] if rank else None, tail=tail, on_reconnect=reconnecting
    ):
        if "end" in event:
            break
        sys.stdout.write(lines.feed(event["rank"], event["text"]))
        sys.stdout.flush()
    sys.stdout.write(lines.flush())
    sys.stdout.flush()


class RankLines:
    """What ``logs -f`` prints of the ranks' texts as they arrive: with ``prefix`` (several
    ranks) or a ``pattern`` (only some lines), whole lines only, each with its rank's prefix: a
    rank's unfinished line waits for its end, so another rank's text never lands inside it.
    Without either, the text as it comes."""

    def __init__(self, *, prefix: bool, pattern: re.Pattern[str] | None) -> None:
        self.prefix, self.pattern = prefix, pattern
        self.pending: dict[str, str] = {}  # a rank's text after its last line end

    def feed(self, rank: str, text: str) -> str:
        if not self.prefix and self.pattern is None:
            return text
        out = []
        for ln in (self.pending.pop(rank, "") + text).splitlines(keepends=True):
            if not ln.endswith(("\n", "\r")):
                self.pending[rank] = ln  # its end comes in a later text
            else:
                out.append(self._line(rank, ln))
        return "".join(out)

    def flush(self) -> str:
        """Every rank's unfinished last line (the stream ended)."""
        out = [self._line(rank, ln + "\n") for rank, ln in self.pending.items()]
        self.pending.clear()
        return "".join(out)

    def _line(self, rank: str, ln: str) -> str:
        if self.pattern is not None and not self.pattern.search(ln):
            return ""
        return f"[rank {rank}] {ln}" if self.prefix else ln


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
        render.download_progress(f"job {job_id} checkpoint", quiet=as_json) as progress,
    ):
        path = c.download_checkpoint(job_id, step, dest, progress=progress)
    if as_json:
        print_json({"job_id": job_id, "path": str(path)})
    else:
        console.print(f"downloaded to {path} (digest verified)", highlight=False)
