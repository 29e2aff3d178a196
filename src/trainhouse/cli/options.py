"""The options many commands share, each declared once: ``--url`` (and the client it names),
``--json``, ``--home``, ``--db`` and ``--db-file``; and :func:`settings_default`, for options
whose default belongs to the server's ``Settings``.

Each shared option is a function returning the ``typer.Option`` (so a command may word its help
its own way) and, for the common wording, a ready ``Annotated`` type: ``url: Url = None``.
Nothing here imports the client, the server or the store: every command module imports this
one, and ``trainhouse --help`` must stay fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from trainhouse.client import Client

HOME_DEFAULT = "~/.trainhouse"  # what --help says; the default itself is Settings' default_home()


def url_option(help: str = "Server URL") -> Any:
    """``--url`` (``TRAINHOUSE_URL``): the server a command talks to."""
    return typer.Option("--url", envvar="TRAINHOUSE_URL", help=help, show_default=False)


def json_option(help: str = "Print JSON instead of a table") -> Any:
    """``--json``: machine-readable output."""
    return typer.Option("--json", help=help)


def home_option(
    help: str = "Server state directory", *, show_default: bool | str = HOME_DEFAULT
) -> Any:
    """``--home`` (``TRAINHOUSE_HOME``): the server's state directory, for the commands that
    run the server or open its database on this machine."""
    return typer.Option("--home", envvar="TRAINHOUSE_HOME", help=help, show_default=show_default)


def db_option(help: str, *, show_default: bool | str = False) -> Any:
    """``--db`` (``TRAINHOUSE_DB``): the server's database URL (default: SQLite under --home)."""
    return typer.Option("--db", envvar="TRAINHOUSE_DB", help=help, show_default=show_default)


def db_file_option(
    help: str = "A file holding the database URL, readable by its owner only (chmod 600; "
    "- reads it from standard input): the password is then on no command line and in no "
    "environment",
) -> Any:
    """``--db-file`` (``TRAINHOUSE_DB_FILE``): the server's database URL, read from a file
    (Settings' ``db_file``); instead of ``--db``."""
    return typer.Option("--db-file", envvar="TRAINHOUSE_DB_FILE", help=help, show_default=False)


Url = Annotated[str | None, url_option()]
Json = Annotated[bool, json_option()]
Home = Annotated[Path | None, home_option()]
DbFile = Annotated[str | None, db_file_option()]


class _SettingsDefault:
    """See :func:`settings_default`. Click calls a callable default to get the value (None
    here); typer's help prints a default that is not a plain function with ``str()``, and a
    flag pair (``--x/--no-x``) shows the side its truth value picks."""

    def __init__(self, shown: object) -> None:
        self.shown = shown

    def __call__(self) -> None:
        return None

    def __str__(self) -> str:
        return str(self.shown)

    def __bool__(self) -> bool:
        return bool(self.shown)

    def __repr__(self) -> str:
        return f"settings_default({self.shown!r})"


def settings_default(shown: object) -> Any:
    """The default of an option whose real default is the server's ``Settings``': the option's
    value is None unless the user gives it (the command then leaves it out of ``Settings(...)``),
    and ``--help`` shows ``[default: SHOWN]`` as it would for a plain default (typer would put a
    ``show_default`` text in parentheses). ``tests/unit/test_cli.py`` checks every shown value
    against ``Settings``."""
    return _SettingsDefault(shown)


def client(url: str | None) -> Client:
    """The client a command reaches the server at ``url`` with (None: TRAINHOUSE_URL or the
    default); imported here, on first use, so that ``--help`` never loads httpx."""
    from trainhouse.client import Client

    return Client(url)
