"""``trainhouse flows`` (list), ``flows show/cancel/resume ID``; and what ``submit FLOW.yaml``
does: submit every step in one request, then follow the flow with one line per step. Every
read has ``--json``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from trainhouse.cli import options
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import (
    EXIT_CANCELED,
    ago,
    console,
    err_console,
    errors,
    page_url,
    print_json,
    state,
)

if TYPE_CHECKING:
    from trainhouse.client import Client
    from trainhouse.client.records import Flow, FlowStep

app = typer.Typer(
    help="Flows: jobs submitted together as steps (train, evaluate, promote), each waiting "
    "for the steps it names.",
    invoke_without_command=True,
)

POLL_SECONDS = 1.0
ENDED = ("COMPLETED", "FAILED", "CANCELED")


def _progress(step: FlowStep) -> str:
    if step["last_step"] is None:
        return "-"
    total = step["total_steps"]
    return f"{step['last_step']}/{total}" if total else str(step["last_step"])


def step_line(step: FlowStep) -> str:
    """One step: ``train      job 31  RUNNING    step 120/270``, with its reason while it
    waits or once it failed."""
    shown = state(step["state"] or "DELETED")
    words = f"{step['name']:<12} job {step['job_id']:<6} {shown}"
    if step["state"] == "RUNNING" and step["last_step"] is not None:
        words += f"  step {_progress(step)}"
    reason = (step.get("reason") or "").splitlines()[0:1]
    if step["state"] in ("QUEUED", "FAILED", "CANCELED") and reason:
        words += f"  ({reason[0][:120]})"
    return words


def result_code(flow: Flow) -> int:
    if flow["state"] == "COMPLETED":
        return 0
    return EXIT_CANCELED if flow["state"] == "CANCELED" else 1


def follow(c: Client, flow: Flow, *, out: object = None) -> Flow:
    """Print each step's line as its state (or progress) changes until the flow ends."""
    printer = out or console
    seen: dict[str, str] = {}
    while True:
        for step in flow["steps"]:
            line = step_line(step)
            key = f"{step['state']}|{step['reason'] if step['state'] != 'RUNNING' else ''}"
            if step["state"] == "RUNNING":
                key += f"|{(step['last_step'] or 0) // max((step['total_steps'] or 100) // 10, 1)}"
            if seen.get(step["name"]) != key:
                seen[step["name"]] = key
                printer.print(line, highlight=False)  # type: ignore[attr-defined]
        if flow["state"] in ENDED:
            return flow
        time.sleep(POLL_SECONDS)
        flow = c.flow(flow["id"])


def submit_flow(
    file: Path, overrides: list[str], *, detach: bool, as_json: bool, url: str | None
) -> None:
    """``submit FLOW.yaml``: every step at once, then follow them (Ctrl-C detaches)."""
    with errors(), options.client(url) as c:
        flow = c.submit_flow(file, overrides=overrides)
        if as_json and detach:
            print_json({"flow": flow["id"], "jobs": flow["jobs"]})
            return
        try:
            if not as_json:
                jobs = ", ".join(f"{s} (job {j})" for s, j in flow["jobs"].items())
                console.print(
                    f"submitted flow [bold]{flow['id']}[/] ({flow['name']}): {jobs} to {c.url}",
                    highlight=False,
                )
                page = page_url(c.url, f"flows/{flow['id']}")
                console.print(f"  dashboard: {page}", highlight=False, soft_wrap=True)
            if detach:
                console.print(f"follow it with: trainhouse flows show {flow['id']}")
                return
            final = follow(c, flow, out=err_console if as_json else console)
        except KeyboardInterrupt:
            console.print(
                f"\ndetached; flow {flow['id']} goes on. See it with `trainhouse flows show "
                f"{flow['id']}`, stop it with `trainhouse flows cancel {flow['id']}`."
            )
            raise typer.Exit(0) from None
    if as_json:
        print_json({"flow": final["id"], "jobs": final["jobs"], "state": final["state"]})
    else:
        console.print(f"flow {final['id']} {state(final['state'])}")
        if final["state"] != "COMPLETED":
            console.print(f"  rerun what did not complete: trainhouse flows resume {final['id']}")
    raise typer.Exit(result_code(final))


def _table(found: list[Flow]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("ID", "NAME", "STATE", "STEPS", "OWNER", "CREATED"):
        table.add_column(col, overflow="fold", no_wrap=col in ("ID", "STATE"))
    for f in found:
        done = sum(1 for s in f["steps"] if s["state"] == "COMPLETED")
        steps = f"{done}/{len(f['steps'])} done: " + ", ".join(
            f"{s['name']}={s['state'] or 'DELETED'}" for s in f["steps"]
        )
        table.add_row(
            str(f["id"]), f["name"], state(f["state"]), steps, f["owner"], ago(f["created_at"])
        )
    return table


@app.callback()
def flows(
    ctx: typer.Context,
    mine: Annotated[bool, typer.Option("--mine", help="Only your flows")] = False,
    limit: Annotated[int, typer.Option(help="At most this many, newest first")] = 50,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """The flows you may see, newest first, each step's state (flows show ID for one)."""
    if ctx.invoked_subcommand is not None:
        return
    with errors(), options.client(url) as c:
        page = c.flows(mine=mine, limit=limit)
    if as_json:
        print_json(page)
        return
    if not page["flows"]:
        console.print("no flows yet: trainhouse submit FLOW.yaml (docs: README, Ship it)")
        return
    console.print(_table(page["flows"]), highlight=False)
    if page["total"] > len(page["flows"]):
        console.print(f"({len(page['flows'])} of {page['total']}; --limit for more)")


@app.command("list")
def list_flows(
    mine: Annotated[bool, typer.Option("--mine", help="Only your flows")] = False,
    limit: Annotated[int, typer.Option(help="At most this many, newest first")] = 50,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """The flows you may see, newest first (the same as trainhouse flows alone)."""
    with errors(), options.client(url) as c:
        page = c.flows(mine=mine, limit=limit)
    if as_json:
        print_json(page)
        return
    console.print(_table(page["flows"]), highlight=False)


def _show(flow: Flow) -> None:
    console.print(
        f"flow [bold]{flow['id']}[/] {flow['name']}  {state(flow['state'])}  "
        f"owner {flow['owner']}  created {ago(flow['created_at'])}",
        highlight=False,
    )
    for step in flow["steps"]:
        console.print("  " + step_line(step), highlight=False)
        links = []
        if step["after"]:
            links.append("after " + ", ".join(step["after"]))
        if step["inputs"]:
            links.append(
                "reads " + ", ".join(f"{k}={v}'s model" for k, v in step["inputs"].items())
            )
        if links:
            console.print("      " + "; ".join(links), highlight=False)


@app.command("show")
def show(
    flow_id: Annotated[int, typer.Argument(metavar="ID")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """A flow's steps: each one's job, state, progress, and what it waits for and reads."""
    with errors(), options.client(url) as c:
        flow = c.flow(flow_id)
    if as_json:
        print_json(flow)
        return
    _show(flow)


@app.command("cancel")
def cancel(
    flow_id: Annotated[int, typer.Argument(metavar="ID")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Cancel every step of a flow that has not ended."""
    with errors(), options.client(url) as c:
        flow = c.cancel_flow(flow_id)
    if as_json:
        print_json(flow)
        return
    _show(flow)


@app.command("resume")
def resume(
    flow_id: Annotated[int, typer.Argument(metavar="ID")],
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return at once")] = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Run again the steps that failed or were canceled (each from its latest checkpoint);
    completed steps and the models they saved are reused. Then follow the flow."""
    with errors(), options.client(url) as c:
        flow = c.resume_flow(flow_id)
        if detach or as_json:
            if as_json:
                print_json(flow)
            else:
                _show(flow)
            return
        try:
            final = follow(c, flow)
        except KeyboardInterrupt:
            console.print(f"\ndetached; flow {flow_id} goes on")
            raise typer.Exit(0) from None
    console.print(f"flow {final['id']} {state(final['state'])}")
    raise typer.Exit(result_code(final))
