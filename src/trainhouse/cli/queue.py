"""``trainhouse queue`` and ``trainhouse set-priority``: the scheduler's queue and the tier a
queued job waits in. Per-user quotas are ``admin quota`` (:mod:`trainhouse.cli.admin`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from trainhouse.cli import options
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import EXIT_BAD_INPUT, ago, console, errors, fail, print_json, state

app = typer.Typer()  # merged into the root: its commands are top-level


@app.command("queue")
def queue_cmd(as_json: Json = False, url: Url = None) -> None:
    """Waiting jobs in the scheduler's decision order, each with why it waits."""
    with errors(), options.client(url) as c:
        data = c.queue()
    if as_json:
        print_json(data)
        return
    if not data["jobs"]:
        console.print("the queue is empty")
    else:
        table = Table(box=None, header_style="bold")
        for col in ("POS", "ID", "NAME", "OWNER", "PRIORITY", "SUBMITTED", "WHY IT WAITS"):
            table.add_column(col, overflow="fold", no_wrap=col != "WHY IT WAITS")
        for j in data["jobs"]:
            reason = (j["reason"] or "").split(": ", 1)[-1]
            table.add_row(
                str(j["position"]),
                str(j["id"]),
                j["name"],
                j["owner"],
                j["priority"],
                ago(j["created_at"]),
                reason,
            )
        console.print(table, highlight=False)
    for p in data["preempting"]:
        console.print(f"job {p['id']} ({p['owner']}) is yielding: {p['reason']}", highlight=False)


@app.command("set-priority")
def set_priority(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    tier: Annotated[str, typer.Argument(metavar="TIER", help="low, normal, high or urgent")],
    url: Url = None,
) -> None:
    """Change a queued job's priority tier."""
    from trainhouse.core.spec import PRIORITY_TIERS

    if tier not in PRIORITY_TIERS:
        fail(f"TIER must be one of {', '.join(PRIORITY_TIERS)}, got {tier!r}", EXIT_BAD_INPUT)
    with errors(), options.client(url) as c:
        job = c.set_priority(job_id, tier)
    console.print(f"job {job_id} {state(job['state'])} now has {job['priority']} priority")
