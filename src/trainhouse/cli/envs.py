"""``trainhouse envs``: the jobs' environments cached on the server's machine (admins)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from trainhouse.cli import options
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import ago, console, errors, print_json

if TYPE_CHECKING:
    from trainhouse.client.records import Env

app = typer.Typer(
    help="The jobs' environments cached on the server's machine (admins).",
    no_args_is_help=True,
)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def _table(rows: list[Env]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("DIGEST", "SIZE", "LAST USED", "IN USE", "JOBS"):
        table.add_column(col, overflow="fold")
    for e in rows:
        table.add_row(
            e["digest"][:12],
            _size(e["size"]),
            ago(e["last_used"]),
            "yes" if e["in_use"] else "no",
            ", ".join(e["jobs"]) or "-",
        )
    return table


@app.command("list")
def envs_list(url: Url = None, as_json: Json = False) -> None:
    """Every cached environment: digest, size, last use, the attempts using it."""
    with errors(), options.client(url) as c:
        found = c.envs()
    if as_json:
        print_json(found)
        return
    console.print(_table(found["envs"]), highlight=False)
    console.print(
        f"{len(found['envs'])} environment(s), {_size(found['total_size'])} of "
        f"{_size(found['max_size'])} in {found['directory']}",
        highlight=False,
    )


@app.command("prune")
def envs_prune(
    all: Annotated[
        bool,
        typer.Option("--all", help="Every environment not in use, not only those past the size"),
    ] = False,
    digest: Annotated[
        str | None, typer.Option("--digest", help="Only this one (its digest or a prefix)")
    ] = None,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Remove environments no attempt uses: the least recently used past the cache's size
    (--env-cache-size), every one (--all) or one (--digest)."""
    with errors(), options.client(url) as c:
        result = c.prune_envs(all=all, digest=digest)
    if as_json:
        print_json(result)
        return
    console.print(_table(result["removed"]), highlight=False)
    console.print(f"removed {len(result['removed'])} environment(s)", highlight=False)
    for d in result["kept_in_use"]:
        console.print(f"kept {d[:12]}: in use", highlight=False)
