"""``trainhouse db upgrade`` and ``trainhouse db current``: the server database's schema.

The embedded SQLite database upgrades itself when the server starts; any other database
(PostgreSQL in production) is upgraded only by an operator running ``trainhouse db upgrade``,
and a server refuses to start on a schema older or newer than its own.

These commands open the database directly; the store and the server's settings load when one
runs, not when the CLI starts. Like the server, they are non-dumpable (other processes of their
user cannot read their environment or memory) and create a SQLite database readable by their
user only.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from trainhouse.cli import render
from trainhouse.cli.options import DbFile, Home, db_option, json_option
from trainhouse.cli.render import console, print_json
from trainhouse.core.errors import StoreError

if TYPE_CHECKING:
    from trainhouse.store.store import Store

app = typer.Typer(
    help="The server's database: its schema revision, and upgrades to this trainhouse's.",
    no_args_is_help=True,
)

DbOpt = Annotated[
    str | None,
    db_option(
        "Database URL, e.g. postgresql+psycopg://user@host:5432/trainhouse",
        show_default="SQLite under --home",
    ),
]


def database_url(url: str | None, home: Path | None, db_file: str | None = None) -> str:
    """The URL the server would use with the same ``--db``, ``--db-file`` and ``--home``
    (exit 2 naming the problem if they conflict, or the file cannot be read or is not
    private). Makes this process non-dumpable first."""
    from trainhouse.jobfs.hardening import no_dump
    from trainhouse.usecases.settings import Settings, default_home

    no_dump()
    if url and db_file:
        render.fail(
            "give the database as --db (TRAINHOUSE_DB) or --db-file (TRAINHOUSE_DB_FILE), not both",
            render.EXIT_BAD_INPUT,
        )
    settings = Settings(
        home=(home or default_home()).expanduser().resolve(), db_url=url, db_file=db_file
    )
    try:
        return settings.database_url
    except ValueError as exc:
        render.fail(str(exc), render.EXIT_BAD_INPUT)


def sqlite_file(store: Store) -> Path | None:
    """The file of a SQLite database (None for any other database, or an in-memory one)."""
    url = store.engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def open_store(url: str) -> Store:
    """The database at ``url``, its schema untouched; a clear error (exit 1) if it cannot be."""
    from trainhouse.store.store import Store

    try:
        return Store(url, migrate="never")
    except StoreError as exc:
        render.fail(str(exc))


def head_revision(store: Store) -> str:
    """The newest schema revision this trainhouse knows (connects to nothing)."""
    from alembic.script import ScriptDirectory

    return ",".join(ScriptDirectory.from_config(store.alembic_config()).get_heads())


@app.command("upgrade")
def upgrade_cmd(db_url: DbOpt = None, db_file: DbFile = None, home: Home = None) -> None:
    """Apply the migrations the database lacks, up to this trainhouse's schema."""
    from trainhouse.jobfs.hardening import private_umask

    store = open_store(database_url(db_url, home, db_file))
    path = sqlite_file(store)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # as the server does
    try:
        before = store.schema_status()
        if before.up_to_date:
            console.print(
                f"{escape(store.safe_url)} is at revision {before.head}, already up to date",
                highlight=False,
                soft_wrap=True,
            )
            return
        with private_umask():  # a new SQLite file: its user's alone
            store.upgrade()
        after = store.schema_status()
    except StoreError as exc:
        render.fail(str(exc))
    finally:
        store.close()
    console.print(
        f"upgraded {escape(store.safe_url)} from revision {before.revision or 'none (empty)'} "
        f"to {after.revision}",
        highlight=False,
        soft_wrap=True,
    )


@app.command("current")
def current_cmd(
    db_url: DbOpt = None,
    db_file: DbFile = None,
    home: Home = None,
    as_json: Annotated[bool, json_option("Print JSON")] = False,
) -> None:
    """The database's schema revision, this trainhouse's head, and whether to upgrade."""
    from trainhouse.store import SchemaStatus

    store = open_store(database_url(db_url, home, db_file))
    path = sqlite_file(store)
    try:
        if path is not None and not path.exists():  # nothing to ask, and no file to create
            status = SchemaStatus(revision=None, head=head_revision(store), known=True)
        else:
            status = store.schema_status()
    except StoreError as exc:
        render.fail(str(exc))
    finally:
        store.close()
    safe = store.safe_url
    report: dict[str, Any] = {
        "database": safe,
        "revision": status.revision,
        "head": status.head,
        "known": status.known,
        "needs_upgrade": status.needs_upgrade,
    }
    if as_json:
        print_json(report)
        return
    if not status.known:
        verdict = (
            "[red]unknown to this trainhouse[/]: a newer trainhouse migrated it; "
            "upgrade trainhouse, or point --db at another database"
        )
    elif status.needs_upgrade:
        verdict = (
            "[yellow]needs an upgrade[/]: run "
            f"`trainhouse db upgrade --db {escape(shlex.quote(safe))}`"
        )
    else:
        verdict = "[green]up to date[/]"
    for label, value in (
        ("database", escape(safe)),
        ("revision", status.revision or "none (no trainhouse schema yet)"),
        ("head", status.head),
        ("status", verdict),
    ):
        console.print(f"[bold]{label:<9}[/]{value}", highlight=False, soft_wrap=True)
