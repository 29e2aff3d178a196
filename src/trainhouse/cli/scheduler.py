"""``trainhouse queue``, ``set-priority`` and ``admin quota``: the scheduler's view and knobs."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from trainhouse.cli.render import ago, console, errors, print_json, state
from trainhouse.client import Client
from trainhouse.spec import PRIORITY_TIERS

admin = typer.Typer(
    help="Administration: the first admin (init), users, API tokens, the audit log, and "
    "per-user quotas and fair-share weights.",
    no_args_is_help=True,
)
quota = typer.Typer(
    help="Per-user caps on concurrent GPUs and CPU cores, and fair-share weights.",
    no_args_is_help=True,
)
admin.add_typer(quota, name="quota")

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="TRAINHOUSE_URL", help="Server URL", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")]


def register(app: typer.Typer) -> None:
    app.add_typer(admin, name="admin")

    @app.command("queue")
    def queue_cmd(as_json: JsonOpt = False, url: UrlOpt = None) -> None:
        """Waiting jobs in the scheduler's decision order, each with why it waits."""
        with errors(), Client(url) as c:
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
            console.print(
                f"job {p['id']} ({p['owner']}) is yielding: {p['reason']}", highlight=False
            )

    @app.command("set-priority")
    def set_priority(
        job_id: Annotated[int, typer.Argument(metavar="JOB")],
        tier: Annotated[str, typer.Argument(metavar="TIER", help="low, normal, high or urgent")],
        url: UrlOpt = None,
    ) -> None:
        """Change a queued job's priority tier."""
        if tier not in PRIORITY_TIERS:
            from trainhouse.cli.render import EXIT_BAD_INPUT, fail

            fail(f"TIER must be one of {', '.join(PRIORITY_TIERS)}, got {tier!r}", EXIT_BAD_INPUT)
        with errors(), Client(url) as c:
            job = c.set_priority(job_id, tier)
        console.print(f"job {job_id} {state(job['state'])} now has {job['priority']} priority")


def _limits_table(data: dict[str, Any]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("USER", "SHARE", "MAX GPUS", "MAX CPUS", "USAGE (cluster-hours, decayed)"):
        table.add_column(col)

    def cap(value: int | None, default: int | None) -> str:
        if value is not None:
            return str(value)
        return f"{default} (default)" if default is not None else "-"

    for u in data["users"]:
        table.add_row(
            u["owner"],
            f"{u['share']:g}",
            cap(u["max_gpus"], data["default_max_gpus"]),
            cap(u["max_cpus"], data["default_max_cpus"]),
            f"{u['usage'] / 3600:.3f}",
        )
    return table


@quota.command("list")
def quota_list(as_json: JsonOpt = False, url: UrlOpt = None) -> None:
    """Every user's caps, fair-share weight and decayed usage."""
    with errors(), Client(url) as c:
        data = c.quotas()
    if as_json:
        print_json(data)
        return
    if not data["users"]:
        console.print("no user has limits or usage yet")
        return
    console.print(_limits_table(data))


@quota.command("set")
def quota_set(
    user: Annotated[str, typer.Argument(help="The job owner's name")],
    gpus: Annotated[int | None, typer.Option("--gpus", help="Max concurrent GPUs")] = None,
    cpus: Annotated[int | None, typer.Option("--cpus", help="Max concurrent CPU cores")] = None,
    share: Annotated[float | None, typer.Option("--share", help="Fair-share weight")] = None,
    url: UrlOpt = None,
) -> None:
    """Set a user's caps and fair-share weight (options not given keep their value)."""
    body: dict[str, Any] = {}
    if gpus is not None:
        body["max_gpus"] = gpus
    if cpus is not None:
        body["max_cpus"] = cpus
    if share is not None:
        body["share"] = share
    with errors(), Client(url) as c:
        limits = c.set_quota(user, body)
    console.print(
        f"{user}: share {limits['share']:g}, max GPUs {limits['max_gpus']}, "
        f"max CPU cores {limits['max_cpus']}",
        highlight=False,
    )


@quota.command("clear")
def quota_clear(user: Annotated[str, typer.Argument()], url: UrlOpt = None) -> None:
    """Remove a user's limits (the server's defaults apply again)."""
    with errors(), Client(url) as c:
        c.clear_quota(user)
    console.print(f"{user}: limits cleared")
