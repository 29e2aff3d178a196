"""The commands about hyperparameter searches: ``search list/show/best/cancel``, and following a
search that ``submit`` started (a spec with a ``search:`` block).

Talks to the server through the client only; rich's table loads with the module, nothing else.
"""

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
    duration,
    err_console,
    errors,
    fmt_value,
    page_url,
    print_json,
)

if TYPE_CHECKING:
    from trainhouse.client.records import Search, SearchDetail

app = typer.Typer(help="Hyperparameter searches (submit a spec with a search: block)")

FOLLOW_SECONDS = 1.0  # between two looks at a followed search
_COUNTED = ("RUNNING", "QUEUED", "COMPLETED", "PRUNED", "FAILED")


def _counts(search: Search) -> str:
    counts = search.get("trial_counts") or {}
    return ", ".join(f"{counts.get(k, 0)} {k.lower()}" for k in _COUNTED)


def _cell(v: object) -> str:
    """A trial's value in a table: "-" for none yet (a running trial's best), numbers in 4
    significant digits, anything else (a categorical hparam) as it is."""
    if v is None:
        return "-"
    if isinstance(v, float | int) and not isinstance(v, bool):
        return fmt_value(float(v)) if isinstance(v, float) else str(v)
    return str(v)


def _best(search: SearchDetail) -> str:
    best = search.get("best")
    if not best:
        return "no trial completed yet"
    params = " ".join(f"{k}={_cell(v)}" for k, v in best["params"].items())
    return (
        f"best: trial {best['number']} (job {best['job_id']}) "
        f"{search['metric']}={fmt_value(best['value'])}  {params}"
    )


def result_code(search: Search) -> int:
    if search["state"] == "CANCELED":
        return EXIT_CANCELED
    return 0 if search.get("best") else 1


def submit_search(
    file: Path, overrides: list[str], *, detach: bool, as_json: bool, url: str | None
) -> None:
    """``submit`` of a search: create it, then follow its trials until it ends."""
    with errors(), options.client(url) as c:
        search = c.submit_search(file, overrides=overrides)
        created = {"search_id": search["id"], **search}
        if as_json and detach:
            print_json(created)
            return
        out = err_console if as_json else console
        out.print(
            f"submitted search [bold]{search['id']}[/] ({search['name']}: "
            f"{search['method']}, {search['max_trials']} trials, {search['max_concurrent']} at "
            f"once) to {c.url}",
            highlight=False,
        )
        page = page_url(c.url, f"searches/{search['id']}")
        out.print(f"  dashboard: {page}", highlight=False, soft_wrap=True)
        if detach:
            out.print(f"follow it with: trainhouse search show {search['id']}")
            return
        last = ""
        try:
            while True:
                view = c.search(search["id"])
                line = f"{_counts(view)}; {_best(view)}"
                if line != last:
                    out.print(f"[{time.strftime('%H:%M:%S')}] {line}", highlight=False)
                    last = line
                warning = view.get("warning")
                if warning and warning not in last:
                    out.print(f"warning: {warning}", highlight=False, markup=False)
                    last += warning
                if view["state"] != "RUNNING" and not (view.get("trial_counts") or {}).get(
                    "RUNNING"
                ):
                    break
                time.sleep(FOLLOW_SECONDS)
        except KeyboardInterrupt:
            out.print(
                f"\ndetached; search {search['id']} keeps running. See it with "
                f"`trainhouse search show {search['id']}`, stop it with "
                f"`trainhouse search cancel {search['id']}`."
            )
            raise typer.Exit(0) from None
        if as_json:
            print_json({"search_id": view["id"], **view})
        else:
            out.print(f"search {view['id']} {view['state']}: {view.get('reason') or ''}")
        raise typer.Exit(result_code(view))


@app.command("list")
def list_(
    all: Annotated[bool, typer.Option("--all", "-a", help="Include ended searches")] = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Searches (by default the running ones), newest first."""
    with errors(), options.client(url) as c:
        found = c.searches(all=all)
    if as_json:
        print_json(found)
        return
    if not found:
        console.print("no searches" + ("" if all else " running (--all shows ended ones)"))
        return
    table = Table("ID", "NAME", "OWNER", "STATE", "METHOD", "METRIC", "TRIALS", "CREATED")
    for s in found:
        counts = s.get("trial_counts") or {}
        ended = sum(counts.get(k, 0) for k in ("COMPLETED", "PRUNED", "FAILED"))
        table.add_row(
            str(s["id"]),
            s["name"],
            s["owner"],
            s["state"],
            f"{s['method']}+{s['early_stopping']}",
            f"{s['metric']} ({s['mode']})",
            f"{ended}/{s['max_trials']}",
            ago(s["created_at"]),
        )
    console.print(table)


@app.command()
def show(
    search_id: Annotated[int, typer.Argument(help="Search id")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """The search: state, each trial (job, state, hparams, latest/best objective), the best."""
    with errors(), options.client(url) as c:
        view = c.search(search_id)
    if as_json:
        print_json(view)
        return
    console.print(
        f"search {view['id']} ({view['name']}) {view['state']}: {view.get('reason') or ''}\n"
        f"  {view['method']} + {view['early_stopping']}, {view['mode']} {view['metric']}, "
        f"{view['max_trials']} trials, {view['max_concurrent']} at once\n  {_counts(view)}",
        highlight=False,
    )
    if view.get("warning"):
        console.print(f"  warning: {view['warning']}", highlight=False, markup=False)
    names = sorted({k for t in view["trials"] for k in t["params"]})
    table = Table("TRIAL", "JOB", "STATE", *names, "LATEST", "BEST", "STEP", "TIME", "REASON")
    for t in view["trials"]:
        table.add_row(
            str(t["number"]),
            str(t["job_id"]),
            t["state"],
            *(_cell(t["params"].get(n)) for n in names),
            _cell(t["latest"]),
            _cell(t["best"]),
            "-" if t["last_step"] is None else str(t["last_step"]),
            duration(t["duration"]),
            t.get("reason") or "",
        )
    console.print(table)
    console.print(_best(view), highlight=False)


@app.command()
def best(
    search_id: Annotated[int, typer.Argument(help="Search id")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """The best completed trial: its hparams and its best checkpoint."""
    with errors(), options.client(url) as c:
        found = c.search_best(search_id)
    if as_json:
        print_json(found)
        return
    console.print(
        f"search {found['search_id']}: trial {found['trial']} (job {found['job_id']}) "
        f"{found['metric']}={fmt_value(found['value'])}",
        highlight=False,
    )
    for key, value in found["hparams"].items():
        console.print(f"  {key}: {value}", highlight=False, markup=False)
    ckpt = found.get("checkpoint")
    if ckpt:
        console.print(
            f"  checkpoint {ckpt['id']} at step {ckpt['step']}: {ckpt['path']}\n"
            f"  download it: trainhouse checkpoints {found['job_id']} "
            f"--download {ckpt['step']} DIR",
            highlight=False,
            markup=False,
        )
    else:
        console.print("  no checkpoint", highlight=False)


@app.command()
def cancel(
    search_id: Annotated[int, typer.Argument(help="Search id")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Stop the search: no new trials; its unfinished trials are canceled."""
    with errors(), options.client(url) as c:
        found = c.cancel_search(search_id)
    if as_json:
        print_json(found)
        return
    console.print(f"search {search_id} canceled; its running trials are stopping")
