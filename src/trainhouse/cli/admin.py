"""``trainhouse admin``: the first admin (``init``), users, API tokens, the audit log and
per-user quotas.

``admin init`` works on the server's database directly (it makes the first admin, before any
token exists) and so imports the store; every other command goes through the REST API with the
caller's token.
"""

from __future__ import annotations

import getpass
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from trainhouse.cli import options
from trainhouse.cli.options import DbFile, Json, Url, db_option, home_option, json_option
from trainhouse.cli.render import ago, console, err_console, errors, fail, print_json

if TYPE_CHECKING:
    from trainhouse.client.records import Quotas

app = typer.Typer(
    help="Administration: the first admin (init), users, API tokens, the audit log, and "
    "per-user quotas and fair-share weights.",
    no_args_is_help=True,
)
quota_app = typer.Typer(
    help="Per-user caps on concurrent GPUs and CPU cores, and fair-share weights.",
    no_args_is_help=True,
)
user_app = typer.Typer(help="Users and their roles (admin, member, viewer).", no_args_is_help=True)
token_app = typer.Typer(
    help="API tokens: made, listed, revoked. The secret is shown once.", no_args_is_help=True
)
app.add_typer(quota_app, name="quota")
app.add_typer(user_app, name="user")
app.add_typer(token_app, name="token")

RoleOpt = Annotated[str, typer.Option("--role", help="admin | member | viewer")]


def _seconds(duration: str) -> float:
    """A duration option (30d, 12h) in seconds; the spec module loads only when one is given."""
    from trainhouse.core.spec import parse_duration

    return float(parse_duration(duration))


def _when(ts: float | None, never: str = "never") -> str:
    return ago(ts) if ts else never


def _expiry(ts: float | None) -> str:
    if ts is None:
        return "never"
    left = ts - time.time()
    if left <= 0:
        return "expired"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _print_secret(secret: str, owner: str, url: str) -> None:
    console.print(f"token for [bold]{owner}[/] (shown once; keep it secret):", highlight=False)
    sys.stdout.write(secret + "\n")
    sys.stdout.flush()
    err_console.print(
        f"sign in with: trainhouse login --url {url}   (paste it), or TRAINHOUSE_TOKEN",
        highlight=False,
    )


@app.command("init")
def admin_init(
    name: Annotated[str, typer.Option("--name", help="The first admin's user name")] = "admin",
    home: Annotated[Path | None, home_option("The server's state directory")] = None,
    db: Annotated[
        str | None, db_option("The server's database URL (default: SQLite under --home)")
    ] = None,
    db_file: DbFile = None,
    login: Annotated[
        bool, typer.Option("--login", help="Also store the token for --url (this user only)")
    ] = False,
    url: Url = None,
    as_json: Annotated[bool, json_option("Print JSON")] = False,
) -> None:
    """Make the first admin and their token, on the server's machine (no token needed)."""
    from trainhouse.cli.db import database_url
    from trainhouse.client import default_url
    from trainhouse.client.credentials import save_token
    from trainhouse.core.tokens import issue
    from trainhouse.jobfs.hardening import private_umask
    from trainhouse.store import Store
    from trainhouse.usecases.settings import default_home

    url_of_db = database_url(db, home, db_file)  # this process is non-dumpable from here on
    with errors(), private_umask():  # a new home and SQLite database: this user's alone
        (home or default_home()).expanduser().resolve().mkdir(
            parents=True, exist_ok=True, mode=0o700
        )
        store = Store(url_of_db, migrate="auto")  # PostgreSQL: db upgrade first
        try:
            accounts = store.accounts
            if accounts.has_admin():
                fail(
                    "this server already has an admin; an admin makes more users and tokens "
                    "with `trainhouse admin user add` and `trainhouse admin token create`"
                )
            accounts.add_user(name, "admin")
            token, secret = issue(accounts, name, "init")
            accounts.audit(getpass.getuser(), "admin.init", name, detail={"token_id": token.id})
        finally:
            store.close()
    target = (url or default_url()).rstrip("/")
    if login:
        path = save_token(target, secret)
        err_console.print(f"stored for {target} in {path}", highlight=False)
    if as_json:
        print_json({"user": name, "role": "admin", "token_id": token.id, "secret": secret})
        return
    _print_secret(secret, name, target)


@user_app.command("add")
def user_add(
    name: Annotated[str, typer.Argument(help="The user's name (lower case)")],
    role: RoleOpt = "member",
    token: Annotated[
        bool, typer.Option("--token/--no-token", help="Also make their first token")
    ] = True,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Add a user (admins); prints their first token unless --no-token."""
    with errors(), options.client(url) as c:
        user = c.add_user(name, role)
        made = c.create_token("default", user=name) if token else None
    if as_json:
        print_json({"user": user, "token": made})
        return
    console.print(f"added {user['role']} [bold]{user['name']}[/]", highlight=False)
    if made:
        _print_secret(made["secret"], name, c.url)


@user_app.command("list")
def user_list(url: Url = None, as_json: Json = False) -> None:
    """Every user with their role (admins)."""
    with errors(), options.client(url) as c:
        users = c.users()
    if as_json:
        print_json(users)
        return
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "ROLE", "ADDED", "STATUS"):
        table.add_column(col)
    for u in users:
        status = f"disabled {ago(u['disabled_at'])}" if u["disabled_at"] else "active"
        table.add_row(u["name"], u["role"], ago(u["created_at"]), status)
    console.print(table, highlight=False)


@user_app.command("set-role")
def user_set_role(
    name: Annotated[str, typer.Argument()],
    role: Annotated[str, typer.Argument(help="admin | member | viewer")],
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Change a user's role (admins)."""
    with errors(), options.client(url) as c:
        user = c.update_user(name, role=role)
    if as_json:
        print_json(user)
        return
    console.print(f"{user['name']} is now {user['role']}", highlight=False)


@user_app.command("disable")
def user_disable(
    name: Annotated[str, typer.Argument()],
    enable: Annotated[bool, typer.Option("--enable", help="Enable them again instead")] = False,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Disable a user: every token of theirs stops working at once (admins)."""
    with errors(), options.client(url) as c:
        user = c.update_user(name, disabled=not enable)
    if as_json:
        print_json(user)
        return
    console.print(f"{user['name']} is {'disabled' if user['disabled_at'] else 'active'}")


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option("--name", help="What the token is for")] = "default",
    user: Annotated[
        str | None, typer.Option("--user", help="Whose token (admins); default: mine")
    ] = None,
    expires: Annotated[
        str | None, typer.Option("--expires", help="Lifetime such as 30d, 12h; default never")
    ] = None,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Make an API token; its secret is printed once and never stored by the server."""
    with errors():
        expires_in = _seconds(expires) if expires else None
        with options.client(url) as c:
            made = c.create_token(name, user=user, expires_in=expires_in)
    if as_json:
        print_json(made)
        return
    _print_secret(made["secret"], made["token"]["user"], c.url)


@token_app.command("list")
def token_list(
    user: Annotated[str | None, typer.Option("--user", help="Whose (admins)")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every user's (admins)")] = False,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Tokens (mine by default) without their secrets."""
    with errors(), options.client(url) as c:
        tokens = c.tokens(user=user, all=all_)
    if as_json:
        print_json(tokens)
        return
    table = Table(box=None, header_style="bold")
    for col in ("ID", "USER", "NAME", "STARTS", "MADE", "LAST USED", "EXPIRES", "STATUS"):
        table.add_column(col)
    for t in tokens:
        status = "revoked" if t["revoked_at"] else ("active" if t["active"] else "expired")
        table.add_row(
            str(t["id"]),
            t["user"],
            t["name"],
            t["prefix"] + "…",
            ago(t["created_at"]),
            _when(t["last_used_at"]),
            _expiry(t["expires_at"]),
            status,
        )
    console.print(table, highlight=False)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="The token's ID (admin token list)")],
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Revoke a token: it stops working at once."""
    with errors(), options.client(url) as c:
        token = c.revoke_token(token_id)
    if as_json:
        print_json(token)
        return
    console.print(f"token {token['id']} ({token['user']}, {token['name']}) is revoked")


@app.command("audit")
def audit_cmd(
    limit: Annotated[int, typer.Option("--limit", help="At most this many entries")] = 50,
    action: Annotated[
        list[str] | None,
        typer.Option("--action", help="Only these actions (repeatable), e.g. job.cancel"),
    ] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="Only this user's")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only the last span, e.g. 1d, 6h")
    ] = None,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """The audit log, newest first: admin actions, cancellations, failed token uses."""
    with errors():
        start = time.time() - _seconds(since) if since else None
        with options.client(url) as c:
            data = c.audit(limit=limit, actions=action, actor=actor, since=start)
    if as_json:
        print_json(data)
        return
    table = Table(box=None, header_style="bold")
    for col in ("WHEN", "ACTOR", "ACTION", "TARGET", "OK", "FROM", "DETAIL"):
        table.add_column(col, overflow="fold", no_wrap=col != "DETAIL")
    for e in data["entries"]:
        detail = ", ".join(f"{k}={v}" for k, v in (e["detail"] or {}).items() if v is not None)
        table.add_row(
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"])),
            e["actor"],
            e["action"],
            e["target"] or "",
            "yes" if e["ok"] else "[red]no[/]",
            e["client"] or "",
            detail,
        )
    console.print(table, highlight=False)
    console.print(f"{len(data['entries'])} of {data['total']} entries", highlight=False)


# -- quotas ----------------------------------------------------------------------------------
def _limits_table(data: Quotas) -> Table:
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


@quota_app.command("list")
def quota_list(as_json: Json = False, url: Url = None) -> None:
    """Every user's caps, fair-share weight and decayed usage."""
    with errors(), options.client(url) as c:
        data = c.quotas()
    if as_json:
        print_json(data)
        return
    if not data["users"]:
        console.print("no user has limits or usage yet")
        return
    console.print(_limits_table(data))


@quota_app.command("set")
def quota_set(
    user: Annotated[str, typer.Argument(help="The job owner's name")],
    gpus: Annotated[int | None, typer.Option("--gpus", help="Max concurrent GPUs")] = None,
    cpus: Annotated[int | None, typer.Option("--cpus", help="Max concurrent CPU cores")] = None,
    share: Annotated[float | None, typer.Option("--share", help="Fair-share weight")] = None,
    url: Url = None,
) -> None:
    """Set a user's caps and fair-share weight (options not given keep their value)."""
    body: dict[str, Any] = {}
    if gpus is not None:
        body["max_gpus"] = gpus
    if cpus is not None:
        body["max_cpus"] = cpus
    if share is not None:
        body["share"] = share
    with errors(), options.client(url) as c:
        limits = c.set_quota(user, body)
    console.print(
        f"{user}: share {limits['share']:g}, max GPUs {limits['max_gpus']}, "
        f"max CPU cores {limits['max_cpus']}",
        highlight=False,
    )


@quota_app.command("clear")
def quota_clear(user: Annotated[str, typer.Argument()], url: Url = None) -> None:
    """Remove a user's limits (the server's defaults apply again)."""
    with errors(), options.client(url) as c:
        c.clear_quota(user)
    console.print(f"{user}: limits cleared")
