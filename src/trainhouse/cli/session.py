"""``trainhouse login``, ``logout`` and ``whoami``: this user's token for a server.

The token is checked against the server and stored by :mod:`trainhouse.client.credentials` (0600,
this user only); ``TRAINHOUSE_TOKEN`` beats the stored one.
"""

from __future__ import annotations

import getpass
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from trainhouse.cli import options
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import console, err_console, errors, fail, print_json

if TYPE_CHECKING:
    from trainhouse.client.records import WhoAmI

app = typer.Typer()  # merged into the root: its commands are top-level


def whoami_line(me: WhoAmI) -> str:
    if not me["auth"]:
        return "this server has auth off: everyone acts as an admin"
    if me["role"] == "job":
        return f"job {me['job_id']}'s credential"
    return f"{me['name']} ({me['role']})"


@app.command()
def login(
    url: Url = None,
    token: Annotated[
        str | None,
        typer.Option("--token", help="The token (default: asked for, or read from piped stdin)"),
    ] = None,
) -> None:
    """Check a token against the server and store it for it (0600, this user only)."""
    from trainhouse.client import Client, default_url
    from trainhouse.client.credentials import save_token

    target = (url or default_url()).rstrip("/")
    if token is None:
        token = (
            sys.stdin.readline() if not sys.stdin.isatty() else getpass.getpass("token: ")
        ).strip()
    if not token:
        fail("no token given", 2)
    with errors(), Client(target, token=token) as c:
        me = c.whoami()
    if me["role"] == "job":
        fail("that is a job's credential, not a person's token", 2)
    path = save_token(target, token)
    console.print(f"signed in to {target} as {whoami_line(me)}", highlight=False)
    err_console.print(f"token stored in {path}", highlight=False)


@app.command()
def logout(url: Url = None) -> None:
    """Forget the stored token for the server (it stays valid: revoke it to end it)."""
    from trainhouse.client import default_url
    from trainhouse.client.credentials import forget_token

    target = (url or default_url()).rstrip("/")
    if forget_token(target):
        console.print(f"forgot the token for {target}", highlight=False)
    else:
        console.print(f"no token was stored for {target}", highlight=False)


@app.command()
def whoami(url: Url = None, as_json: Json = False) -> None:
    """Who the server takes you for."""
    with errors(), options.client(url) as c:
        me = c.whoami()
    if as_json:
        print_json(me)
        return
    console.print(whoami_line(me), highlight=False)
