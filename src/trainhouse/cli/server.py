"""``trainhouse server`` (run the server) and ``trainhouse demo`` (the embedded quick start).

``server`` builds the server's :class:`~trainhouse.usecases.settings.Settings` from the options the
user gave, and only those: the defaults are Settings' (``--help`` shows them through
:func:`~trainhouse.cli.options.settings_default`), and ``Settings.validate`` checks the values (the
three range checks ``--help`` shows as ``x>=...`` stay on their options too). The server (FastAPI,
the store, the executors) is imported when ``server`` runs, never when the CLI starts; ``demo``
starts one in a child process (:class:`~trainhouse.client.serverprocess.ServerProcess`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainhouse.cli import render
from trainhouse.cli.options import (
    DbFile,
    Home,
    db_option,
    home_option,
    settings_default,
    url_option,
)
from trainhouse.cli.render import console, errors, page_url
from trainhouse.core.errors import ServerUnreachable
from trainhouse.executors.registry import EXECUTORS

if TYPE_CHECKING:
    from trainhouse.client.serverprocess import ServerProcess
    from trainhouse.usecases.settings import Settings

app = typer.Typer()  # merged into the root: its commands are top-level

EXECUTOR_CHOICES = " or ".join(f"{name} ({entry.summary})" for name, entry in EXECUTORS.items())


def port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        # as uvicorn does: a port whose last server left only TIME-WAIT sockets is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_database(settings: Settings) -> None:
    """Refuse a database whose schema this trainhouse cannot serve with a message, not a
    traceback from the app's startup. The embedded SQLite is brought up to date here; any
    other database must already be (an operator runs ``trainhouse db upgrade``)."""
    from trainhouse.store.store import Store

    settings.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    Store(settings.database_url, migrate="auto").close()


def serve(settings: Settings, *, log_level: str = "info") -> None:
    """Run the server in this process, which it then is: from here on everything it (and the
    jobs it starts) creates is private to its user (umask 077)."""
    import logging
    import os
    import stat

    import uvicorn

    from trainhouse.jobfs.hardening import PRIVATE_UMASK
    from trainhouse.server import create_app

    os.umask(PRIVATE_UMASK)
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    check_database(settings)
    mode = stat.S_IMODE(settings.home.stat().st_mode)
    if mode & 0o007:
        logging.getLogger("trainhouse.server").warning(
            "the server's home %s has mode %04o: other users of this machine can read what "
            "is in it that is not private itself (chmod 700 it)",
            settings.home,
            mode,
        )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        access_log=log_level == "debug",
        timeout_graceful_shutdown=5,
    )


@app.command()
def server(
    host: Annotated[str | None, typer.Option(help="Address to listen on")] = settings_default(
        "127.0.0.1"
    ),
    port: Annotated[int | None, typer.Option(help="Port to listen on")] = settings_default(8470),
    db: Annotated[
        str | None,
        db_option(
            "Database URL (default: SQLite under --home); --db-file or TRAINHOUSE_DB keep a "
            "password off the command line, and jobs never see TRAINHOUSE_* variables"
        ),
    ] = None,
    db_file: DbFile = None,
    home: Home = None,
    gpus: Annotated[
        str | None, typer.Option(help="GPUs to offer: a count or indices (0,1); 0 for none")
    ] = None,
    cpus: Annotated[int | None, typer.Option(help="CPU cores to offer")] = None,
    executor: Annotated[
        str | None, typer.Option(help=f"Executor: {EXECUTOR_CHOICES}")
    ] = settings_default("local"),
    ray_address: Annotated[
        str | None,
        typer.Option(help="The Ray cluster's address (HOST:PORT of its GCS), for ray"),
    ] = None,
    ray_placement_timeout: Annotated[
        float | None,
        typer.Option(
            min=1.0,
            help="Seconds Ray gets to place a job's placement group before the job goes "
            "back to the queue",
        ),
    ] = settings_default(60.0),
    ray_node_dir: Annotated[
        str | None,
        typer.Option(
            help="Directory on each Ray node for the jobs' code, logs and temp files",
            show_default="$TMPDIR/trainhouse-ray",
        ),
    ] = None,
    shared_home: Annotated[
        bool | None,
        typer.Option(
            help="Every Ray node mounts --home at the same path (so checkpoints under it "
            "are shared; multi-node jobs need shared checkpoint storage)"
        ),
    ] = settings_default(False),
    advertise_url: Annotated[
        str | None,
        typer.Option(
            help="The URL ranks on other machines reach this server at "
            "(e.g. http://head-node:8470)",
            show_default="http://--host:--port",
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            help="Another name this server answers to in the Host header (repeatable): the "
            "public name a reverse proxy forwards, or the machine's name on the network. Other "
            "names are refused, against DNS rebinding",
            show_default="--host, localhost, the --advertise-url host",
        ),
    ] = None,
    quota_gpus: Annotated[
        int | None, typer.Option(help="Default cap on each user's concurrent GPUs")
    ] = None,
    quota_cpus: Annotated[
        int | None, typer.Option(help="Default cap on each user's concurrent CPU cores")
    ] = None,
    cancel_grace: Annotated[
        float | None, typer.Option(help="Seconds a canceled job gets to stop before SIGTERM")
    ] = settings_default(10.0),
    fairshare_half_life: Annotated[
        str | None, typer.Option(help="Half-life of fair-share usage (e.g. 7d, 12h)")
    ] = settings_default("7d"),
    max_infra_restarts: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Restarts per job after infrastructure failures (a killed rank, a lost "
            "node); failures of the job's code are bounded by its max_restarts",
        ),
    ] = settings_default(20),
    checkpoint_url: Annotated[
        str | None,
        typer.Option(
            help="Where jobs write checkpoints: a shared directory or an fsspec URL "
            "(s3://bucket/prefix); each job gets a folder under it",
            show_default="HOME/jobs/<id>/checkpoints",
        ),
    ] = None,
    log_retention: Annotated[
        str | None,
        typer.Option(
            help="Delete a job's logs this long after it ended (e.g. 30d)",
            show_default="keep them",
        ),
    ] = None,
    monitor_interval: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Seconds between resource samples of the node and its jobs; 0 turns sampling off",
        ),
    ] = settings_default(5.0),
    monitor_retention: Annotated[
        str | None, typer.Option(help="How long resource samples are kept (e.g. 7d, 12h)")
    ] = settings_default("7d"),
    auth: Annotated[
        bool,
        typer.Option(
            "--auth",
            help="Check tokens even on 127.0.0.1 (on any other address they always are)",
        ),
    ] = False,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Check no tokens on a non-loopback address: only behind something else "
            "that authenticates every request",
        ),
    ] = False,
    job_visibility: Annotated[
        str | None,
        typer.Option(
            help="What non-admins see of others' jobs: own (nothing), list (the job list "
            "and queue), all (everything, read-only)"
        ),
    ] = settings_default("own"),
    env_index_url: Annotated[
        str | None,
        typer.Option(
            envvar="TRAINHOUSE_ENV_INDEX_URL",
            help="The package index of the jobs' environments unless a spec gives one "
            "(credentials in it never reach a job's logs)",
            show_default="PyPI",
        ),
    ] = None,
    env_extra_index_url: Annotated[
        list[str] | None,
        typer.Option(help="Another index of the jobs' environments (repeatable)"),
    ] = None,
    env_find_links: Annotated[
        list[str] | None,
        typer.Option(help="A directory or URL of wheels for the jobs' environments (repeatable)"),
    ] = None,
    env_cache_size: Annotated[
        str | None,
        typer.Option(
            help="Size of each node's cache of job environments; past it, the least recently "
            "used ones not in use are removed (e.g. 20G)"
        ),
    ] = settings_default("20G"),
    dataset_storage: Annotated[
        Path | None,
        typer.Option(
            help="Where the server keeps uploaded datasets and --copy copies (a directory)",
            show_default="HOME/datasets",
        ),
    ] = None,
    dataset_cache_bytes: Annotated[
        str | None,
        typer.Option(
            help="Size of each node's cache of staged dataset versions; past it, the least "
            "recently used versions no running job pins are removed (0: no limit)"
        ),
    ] = settings_default("100G"),
    dataset_upload_bytes: Annotated[
        str | None, typer.Option(help="The largest dataset directory a client may upload")
    ] = settings_default("8G"),
    dataset_root: Annotated[
        list[Path] | None,
        typer.Option(
            help="A directory file:// dataset sources may lie in (repeatable; none: file:// "
            "sources are refused)"
        ),
    ] = None,
    dataset_allow_private: Annotated[
        bool,
        typer.Option(
            help="Let http(s) dataset sources name loopback or private addresses (a store on "
            "the cluster's own network)"
        ),
    ] = False,
    model_max_bytes: Annotated[
        str | None,
        typer.Option(
            help="The most a model version's files may hold together (a job's saved model, a "
            "checkpoint registered with --loader); a larger one is refused before it is read"
        ),
    ] = settings_default("256G"),
    clone_max_bytes: Annotated[
        str | None,
        typer.Option(
            help="The largest checkpoint clone --from-checkpoint copies; a larger one is "
            "refused before it is read"
        ),
    ] = settings_default("256G"),
    log_level: Annotated[str, typer.Option(help="debug, info, warning")] = "info",
) -> None:
    """Run the trainhouse server in the foreground."""
    from trainhouse.jobfs.hardening import no_dump
    from trainhouse.usecases.settings import Settings, default_home

    # first: the processes of this user (jobs) cannot read this one's environment or memory
    no_dump()
    given: dict[str, Any] = {
        "host": host,
        "port": port,
        "db_url": db,
        "db_file": db_file,
        "cpus": cpus,
        "gpus": gpus,
        "executor": executor,
        "ray_address": ray_address,
        "ray_placement_timeout": ray_placement_timeout,
        "ray_node_dir": ray_node_dir,
        "shared_home": shared_home,
        "advertise_url": advertise_url,
        "allowed_hosts": tuple(allowed_host) if allowed_host else None,
        "quota_gpus": quota_gpus,
        "quota_cpus": quota_cpus,
        "cancel_grace": cancel_grace,
        "fairshare_half_life": _seconds("--fairshare-half-life", fairshare_half_life),
        "max_infra_restarts": max_infra_restarts,
        "checkpoint_url": checkpoint_url,
        "log_retention": _seconds("--log-retention", log_retention),
        "monitor_interval": monitor_interval,
        "monitor_retention": _seconds("--monitor-retention", monitor_retention),
        "auth": True if auth else None,  # None: on unless the server listens on loopback only
        "insecure_no_auth": insecure_no_auth or None,
        "job_visibility": job_visibility,
        "env_index_url": env_index_url,
        "env_extra_index_urls": tuple(env_extra_index_url) if env_extra_index_url else None,
        "env_find_links": tuple(env_find_links) if env_find_links else None,
        "env_cache_size": _bytes("--env-cache-size", env_cache_size),
        "dataset_storage": dataset_storage.expanduser().resolve() if dataset_storage else None,
        "dataset_cache_bytes": _bytes("--dataset-cache-bytes", dataset_cache_bytes),
        "dataset_upload_bytes": _bytes("--dataset-upload-bytes", dataset_upload_bytes),
        "dataset_file_roots": (
            tuple(p.expanduser().resolve() for p in dataset_root) if dataset_root else None
        ),
        "dataset_allow_private": dataset_allow_private or None,
        "model_max_bytes": _bytes("--model-max-bytes", model_max_bytes),
        "clone_max_bytes": _bytes("--clone-max-bytes", clone_max_bytes),
    }
    settings = Settings(
        home=(home or default_home()).expanduser().resolve(),
        **{name: value for name, value in given.items() if value is not None},
    )
    try:
        settings.validate()
    except ValueError as exc:
        render.fail(str(exc), render.EXIT_BAD_INPUT)
    if not port_free(settings.host, settings.port):
        render.fail(
            f"cannot listen on {settings.host}:{settings.port}: the port is in use "
            "(is another trainhouse server running? pick one with --port)",
            render.EXIT_BAD_INPUT,
        )
    if settings.insecure_no_auth:
        render.err_console.print(
            f"[bold yellow]warning:[/] auth is off on {settings.host}: anyone who reaches "
            f"{settings.url} can run code on this machine",
            highlight=False,
        )
    with errors():
        serve(settings, log_level=log_level)


def _seconds(option: str, duration: str | None) -> float | None:
    """A duration option (7d, 12h) in seconds; None if not given. A bad one ends the command
    with exit code 2, naming the option."""
    if duration is None:
        return None
    from trainhouse.core.spec import parse_duration

    try:
        return float(parse_duration(duration))
    except ValueError as exc:
        render.fail(f"{option} {exc}", render.EXIT_BAD_INPUT)


def _bytes(option: str, size: str | None) -> int | None:
    """A size option (20G, 512M) in bytes; None if not given. A bad one ends the command with
    exit code 2, naming the option."""
    if size is None:
        return None
    from trainhouse.core.envspec import parse_size

    try:
        return parse_size(size)
    except ValueError as exc:
        render.fail(f"{option} {exc}", render.EXIT_BAD_INPUT)


@app.command()
def demo(
    example: Annotated[
        Path | None, typer.Option(help="Example directory with a trainhouse.yaml")
    ] = None,
    home: Annotated[Path | None, home_option(show_default=False)] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override key=value")] = None,
    url: Annotated[str | None, url_option("Use this running server")] = None,
    keep: Annotated[
        bool | None,
        typer.Option(
            "--keep/--no-keep",
            help="Keep the server the demo started running after the job, until Ctrl-C, to look "
            "around the dashboard  [default: --keep in a terminal, --no-keep otherwise]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """The quick start: start a server, train the digits example, show the results, and keep
    the server (and its dashboard) running until Ctrl-C."""
    if keep is None:
        keep = sys.stdin.isatty() and sys.stdout.isatty()
    run_demo(example, home, set_ or [], url, keep=keep)


def example_dir() -> Path:
    from importlib import resources

    packaged = Path(str(resources.files("trainhouse") / "examples" / "digits"))
    if (packaged / "trainhouse.yaml").is_file():
        return packaged
    repo = Path(__file__).resolve().parents[3] / "examples" / "digits"
    if (repo / "trainhouse.yaml").is_file():
        return repo
    render.fail("cannot find the digits example; pass --example DIR", render.EXIT_BAD_INPUT)


def run_demo(
    example: Path | None,
    home: Path | None,
    overrides: list[str],
    url: str | None,
    *,
    keep: bool = False,
) -> None:
    from trainhouse.cli.follow import Follower
    from trainhouse.cli.jobs import result_code, summary
    from trainhouse.client import DEFAULT_URL, Client
    from trainhouse.client.serverprocess import ServerProcess, free_port
    from trainhouse.usecases.settings import DEFAULT_PORT, default_home

    spec_file = (example or example_dir()) / "trainhouse.yaml"
    home = (home or default_home()).expanduser().resolve()
    background: ServerProcess | None = None
    target = url or DEFAULT_URL
    c = Client(target)
    try:
        c.health()
        console.print(f"using the trainhouse server already running at {target}")
    except ServerUnreachable:
        c.close()
        port = DEFAULT_PORT if url is None and port_free("127.0.0.1", DEFAULT_PORT) else free_port()
        background = ServerProcess(home, port)
        background.own_session = True
        console.print(
            f"starting a trainhouse server at {background.url} "
            f"(state in {home}, log in {background.log})"
        )
        with errors():
            background.start()
        c = Client(background.url)
    code, finished = 1, False
    try:
        with errors():
            job = c.submit(spec_file, overrides=overrides)
            console.print(
                f"submitted job [bold]{job['id']}[/] ({job['name']}): "
                f"{job['spec']['resources']['procs_per_node']} DDP ranks over gloo",
                highlight=False,
            )
            page = page_url(c.url, f"jobs/{job['id']}")
            console.print(f"  dashboard: {page}", highlight=False, soft_wrap=True)
            final = Follower(c, job["id"]).run()
            summary(final)
            acc = (final.get("latest_metrics") or {}).get("val_acc")
            if acc is not None:
                console.print(f"[bold]validation accuracy: {acc:.3f}[/]")
            code, finished = result_code(final), True
            console.print(
                f"the job's page on the dashboard: {page}", highlight=False, soft_wrap=True
            )
        if background is not None and keep:
            _keep_serving(background, home)
    except KeyboardInterrupt:
        if finished:  # Ctrl-C on the kept server: the demo's result stays the job's
            console.print()
        else:
            console.print("\ninterrupted")
            code = 130
    finally:
        c.close()
        if background is not None:
            background.stop()
            console.print(
                f"the demo server has stopped; its state is kept in {home}. Start it again "
                f"with `trainhouse server --home {home}` to look around (`trainhouse ps --all`)."
            )
    raise typer.Exit(code)


def _keep_serving(background: ServerProcess, home: Path) -> None:
    """After the demo's job: the server goes on, for the dashboard, until Ctrl-C (raised
    here as KeyboardInterrupt) or until it exits by itself."""
    console.print(
        f"\nthe demo server keeps running at {background.url} (the dashboard; state in {home})",
        highlight=False,
        soft_wrap=True,  # an address stays whole, whatever the terminal's width
    )
    console.print("press Ctrl-C to stop it", highlight=False)
    exited = background.wait()
    render.err_console.print(
        f"the demo server exited by itself (code {exited}); see {background.log}",
        highlight=False,
    )
