"""``trainhouse top``: what each node and each running job uses, live (from the server's
resource samples, through the client)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group
from rich.table import Table

from trainhouse.cli import options
from trainhouse.cli.options import Url, json_option
from trainhouse.cli.render import ago, console, errors, print_json, state

if TYPE_CHECKING:
    from trainhouse.client import Client
    from trainhouse.client.records import SystemSeries

JOB_WINDOW = 60.0  # seconds of a job's samples to take its latest from

app = typer.Typer()  # merged into the root: its command is top-level


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def job_usage(series: list[SystemSeries]) -> dict[str, Any]:
    """A job's latest sample from its series: CPU, RSS, processes, GPU memory per GPU."""
    out: dict[str, Any] = {
        "cpu_percent": None,
        "rss_bytes": None,
        "processes": None,
        "gpu_memory_bytes": {},
        "sampled_at": None,
    }
    for s in series:
        if not s["points"]:
            continue
        at, value = s["points"][-1]
        if s["name"] == "gpu_memory_bytes" and s["gpu"] is not None:
            out["gpu_memory_bytes"][str(s["gpu"])] = value
        elif s["name"] in ("cpu_percent", "rss_bytes", "processes"):
            out[s["name"]] = value
        out["sampled_at"] = max(out["sampled_at"] or 0.0, at)
    return out


def gather(c: Client) -> dict[str, Any]:
    """Nodes with their latest sample, and every running job with its latest."""
    inventory = c.nodes()
    nodes = inventory["nodes"]
    jobs = []
    for j in c.jobs(all=False):
        if j["state"] != "RUNNING":
            continue
        usage = job_usage(c.job_system(j["id"], since=-JOB_WINDOW)["series"])
        jobs.append(
            {
                "id": j["id"],
                "name": j["name"],
                "owner": j["owner"],
                "state": j["state"],
                "step": j.get("last_step"),
                "total_steps": j.get("total_steps"),
                **usage,
            }
        )
    return {
        "nodes": nodes,
        "jobs": jobs,
        "node_events": inventory.get("node_events") or [],
        "autoscaler": inventory.get("autoscaler"),
    }


EVENTS_SHOWN = 8  # the latest node arrivals and departures a frame shows


def bundles_text(bundles: list[dict[str, float]]) -> str:
    """``2 x {CPU: 2}, 1 x {CPU: 8, GPU: 1}``: the bundles of a request, alike ones counted."""
    counts: dict[str, int] = {}
    for b in bundles:
        key = "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(b.items())) + "}"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} x {key}" for key, n in counts.items())


def render_cluster(data: dict[str, Any]) -> list[Any]:
    """Nodes that joined and left lately, and what was asked of the cluster's autoscaler."""
    out: list[Any] = []
    events = data.get("node_events") or []
    if events:
        table = Table(title="nodes joined and left", title_justify="left", box=None)
        for col in ("WHEN", "NODE", "EVENT", "TYPE", "CPU", "GPUS"):
            table.add_column(col, no_wrap=True, header_style="bold")
        for e in events[-EVENTS_SHOWN:]:
            table.add_row(
                ago(e["at"]),
                e["node"],
                e["event"],
                e["node_type"] or "-",
                str(e["cpus"]),
                str(e["gpus"]),
            )
        out += ["", table]
    scaler = data.get("autoscaler")
    if scaler:
        types = ", ".join(
            f"{t['name']} {t['up']}/{t['max_workers']}"
            + (
                f" (+{scaler['launching'][t['name']]} launching)"
                if t["name"] in scaler["launching"]
                else ""
            )
            for t in scaler["node_types"]
        )
        lines = [f"autoscaler: {types}"]
        for a in scaler["asked"]:
            what = f"{a['nodes']} node(s)" if a["nodes"] else "room on a node"
            kind, since = a["node_type"], ago(a["since"])
            lines.append(f"  job {a['job']} waits for {what} of type {kind}, asked {since}")
        last = scaler["requests"][-1] if scaler["requests"] else None
        if last is not None:
            asked = bundles_text(last["bundles"]) if last["bundles"] else "nothing (withdrawn)"
            lines.append(f"  last request {ago(last['at'])}: {asked}")
        out += ["", "\n".join(lines)]
    return out


def render(data: dict[str, Any]) -> Group:
    nodes = Table(title="nodes", title_justify="left", box=None, header_style="bold")
    for col in ("NODE", "CPU", "MEMORY", "FREE", "GPUS", "SAMPLED"):
        nodes.add_column(col, no_wrap=col != "GPUS", overflow="fold")
    for n in data["nodes"]:
        gpus = []
        for g in n.get("gpus_live") or []:
            fb = "-" if g["fb_used"] is None else _size(g["fb_used"] * (1 << 20))
            power = "-" if g["power"] is None else f"{g['power']:.0f} W"
            temp = "-" if g["temp"] is None else f"{g['temp']:.0f} C"
            gpus.append(f"{g['index']}: {_pct(g['util'])} {fb} {power} {temp}")
        if not gpus:
            gpus = [f"{len(n['gpus'])} declared, not sampled" if n["gpus"] else "none"]
        gpus.extend(n.get("held") or [])  # GPUs a process of an ended attempt still holds
        nodes.add_row(
            n["name"],
            f"{_pct(n.get('cpu_percent'))} of {n['cpus']}",
            f"{_size(n.get('memory_used_bytes'))} / {_size(n['memory_bytes'])}",
            f"{n['free_cpus']} cpus, {len(n['free_gpus'])} gpus",
            "\n".join(gpus),
            ago(n.get("sampled_at")),
        )
    jobs = Table(title="running jobs", title_justify="left", box=None, header_style="bold")
    for col in ("ID", "NAME", "OWNER", "STATE", "STEP", "CPU", "RSS", "GPU MEM", "PROCS"):
        jobs.add_column(col, no_wrap=True)
    for j in data["jobs"]:
        step = "-" if j["step"] is None else str(j["step"])
        if j["total_steps"]:
            step += f"/{j['total_steps']}"
        gpu_mem = ", ".join(f"{g}: {_size(b)}" for g, b in sorted(j["gpu_memory_bytes"].items()))
        procs = j["processes"]
        jobs.add_row(
            str(j["id"]),
            j["name"],
            j["owner"],
            state(j["state"]),
            step,
            _pct(j["cpu_percent"]),
            _size(j["rss_bytes"]),
            gpu_mem or "-",
            "-" if procs is None else str(int(procs)),
        )
    cluster = render_cluster(data)
    if not data["jobs"]:
        return Group(nodes, *cluster, "", "no running jobs")
    return Group(nodes, *cluster, "", jobs)


@app.command("top")
def top_cmd(
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit")] = False,
    as_json: Annotated[bool, json_option("Print the data once as JSON")] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes")] = 2.0,
    url: Url = None,
) -> None:
    """Live resource use: each node's CPU, memory and GPUs, each running job's processes'
    CPU, RSS and GPU memory (Ctrl-C quits)."""
    with errors(), options.client(url) as c:
        data = gather(c)
        if as_json:
            print_json(data)
            return
        if once:
            console.print(render(data), highlight=False)
            return
        from rich.live import Live

        try:
            with Live(render(data), console=console, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(render(gather(c)), refresh=True)
        except KeyboardInterrupt:
            pass
