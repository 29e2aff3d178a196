"""``trainhouse serve NAME@ALIAS`` and ``serve list/show/stop``: services, a model version
served by a long-running job of replicas.

``serve`` with a model reference starts a service (``serve start`` is the same command); the
other words are its subcommands. Every read has ``--json``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from typer.core import TyperGroup

from trainhouse.cli import options
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import ago, console, err_console, errors, page_url, print_json

if TYPE_CHECKING:
    from trainhouse.client.records import Service


class _StartByDefault(TyperGroup):
    """``serve NAME@REF ...`` runs ``serve start NAME@REF ...``; ``serve list`` lists."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # a click Context
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["start", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_StartByDefault,
    help="Serve a model version (NAME@ALIAS follows the alias): serve NAME@ALIAS, serve list, "
    "serve show NAME, serve stop NAME",
    no_args_is_help=True,
)


def _version(s: Service) -> str:
    if s["version"] is not None:
        return str(s["version"])
    if s["versions"]:
        return "+".join(str(v) for v in s["versions"]) + " (switching)"
    return "-"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@app.command("start")
def start(
    ref: Annotated[str, typer.Argument(metavar="NAME@ALIAS|NAME@VERSION")],
    name: Annotated[
        str | None, typer.Option("--name", help="The service's name (default: the model's)")
    ] = None,
    replicas: Annotated[int, typer.Option("--replicas", min=1, max=64)] = 1,
    gpus_per_replica: Annotated[int, typer.Option("--gpus-per-replica", min=0, max=1)] = 0,
    max_batch: Annotated[
        int, typer.Option("--max-batch", min=1, max=1024, help="Examples in a batch at most")
    ] = 32,
    max_wait_ms: Annotated[
        float,
        typer.Option("--max-wait-ms", min=0, max=1000, help="A batch waits this long for more"),
    ] = 5.0,
    priority: Annotated[
        str,
        typer.Option(
            "--priority",
            help="low, normal, high, urgent: a service, like any job, is preempted only by a job "
            "of a higher tier",
        ),
    ] = "normal",
    wait: Annotated[bool, typer.Option("--wait", help="Return once every replica answers")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds --wait waits")] = 600.0,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Start serving a model version.

    A service is a long-running job of replicas that the scheduler places like any job; it
    returns once the service is queued (--wait: once it answers)."""
    with errors(), options.client(url) as c:
        found = c.serve(
            ref,
            name=name,
            replicas=replicas,
            gpus_per_replica=gpus_per_replica,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            priority=priority,
        )
        if not as_json:
            console.print(
                f"service {found['name']}: {found['model']}@{found['ref']} "
                f"(version {found['target_version']}), job {found['job_id']}, {found['state']}"
            )
            page = page_url(c.url, f"services/{found['name']}")
            console.print(f"  dashboard: {page}", highlight=False, soft_wrap=True)
        if wait:
            if not as_json:
                err_console.print(f"waiting for {found['replicas']} replica(s) to answer ...")
            found = c.wait_service(found["name"], timeout=timeout)
    if as_json:
        print_json(found)
        return
    if wait:
        console.print(
            f"service {found['name']} answers with version {_version(found)}: "
            f"POST {c.url}/api/v1/services/{found['name']}/predict"
        )


@app.command("list")
def list_services(as_json: Json = False, url: Url = None) -> None:
    """List services: state, version, replicas, requests/s, latency."""
    with errors(), options.client(url) as c:
        found = c.services()
    if as_json:
        print_json(found)
        return
    if not found:
        console.print("no services: trainhouse serve NAME@ALIAS")
        return
    table = Table(box=None, header_style="bold")
    cols = ("NAME", "MODEL", "VERSION", "STATE", "REPLICAS", "REQ/S", "P50 MS", "P99 MS", "JOB")
    for col in cols:
        table.add_column(col, overflow="fold")
    for s in found:
        lat = s["stats"]["latency_ms"]
        table.add_row(
            s["name"],
            f"{s['model']}@{s['ref']}",
            _version(s),
            s["state"],
            f"{s['ready_replicas']}/{s['replicas']}",
            f"{s['stats']['requests_per_s']:.1f}",
            _ms(lat["p50"]),
            _ms(lat["p99"]),
            "-" if s["job_id"] is None else str(s["job_id"]),
        )
    console.print(table, highlight=False)


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(metavar="NAME")], as_json: Json = False, url: Url = None
) -> None:
    """A service: what it follows, the version that answers, each replica, its latency."""
    with errors(), options.client(url) as c:
        s = c.service(name)
    if as_json:
        print_json(s)
        return
    stats, lat = s["stats"], s["stats"]["latency_ms"]
    console.print(f"[bold]{s['name']}[/]  {s['state']}  owner {s['owner']}", highlight=False)
    target = s["target_version"] if s["target_version"] is not None else "-"
    console.print(
        f"model      {s['model']}@{s['ref']} (names version {target}); "
        f"answering: version {_version(s)}",
        highlight=False,
    )
    if s["problem"]:
        console.print(f"problem    {s['problem']}", highlight=False)
    console.print(
        f"job        {s['job_id']} ({s['job_state']}), priority {s['priority']}, "
        f"{s['replicas']} replica(s), {s['gpus_per_replica']} GPU each, "
        f"max batch {s['max_batch']}, max wait {s['max_wait_ms']:g} ms",
        highlight=False,
    )
    mean = "-" if stats["mean_batch"] is None else f"{stats['mean_batch']:.1f}"
    console.print(
        f"traffic    {stats['requests_per_s']:.1f} req/s, latency p50 {_ms(lat['p50'])} ms "
        f"p95 {_ms(lat['p95'])} ms p99 {_ms(lat['p99'])} ms, mean batch {mean} "
        f"(last {stats['window_s']:g} s); {stats['requests_total']} requests, "
        f"{stats['errors_total']} errors since the server started",
        highlight=False,
    )
    if s["replica_list"]:
        table = Table(box=None, header_style="bold")
        for col in ("RANK", "STATE", "VERSION", "REQUESTS", "BATCHES", "SEEN", "ERROR"):
            table.add_column(col, overflow="fold")
        for r in s["replica_list"]:
            table.add_row(
                str(r["rank"]),
                r["state"],
                "-" if r["version"] is None else str(r["version"]),
                str(r["requests"]),
                str(r["batches"]),
                ago(r["last_seen"]),
                r["error"] or "",
            )
        console.print(table, highlight=False)


@app.command("stop")
def stop(
    name: Annotated[str, typer.Argument(metavar="NAME")], as_json: Json = False, url: Url = None
) -> None:
    """Stop a service: its job is canceled, its replicas end."""
    with errors(), options.client(url) as c:
        s = c.stop_service(name)
    if as_json:
        print_json(s)
        return
    console.print(f"service {name} stopping (job {s['job_id']} canceled)")
