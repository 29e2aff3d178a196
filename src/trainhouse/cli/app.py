"""The ``trainhouse`` command: the root typer app, its commands listed in :data:`COMMANDS`.

Each command lives in a noun module of this package, imported when the command is first looked
up (:mod:`trainhouse.cli.lazy`): ``trainhouse --help`` lists the table and imports no noun
module, ``trainhouse ps`` imports :mod:`~trainhouse.cli.jobs` only. A noun module's commands are
top-level (typer's ``add_typer`` without a name) unless its entry is a group (``models``,
``admin``, ``db``, ...). Each noun module imports only what its commands need to start: the
client, the spec, the server and the store load inside the commands that use them.

- :mod:`~trainhouse.cli.server`: ``server``, ``demo``
- :mod:`~trainhouse.cli.queue`: ``queue``, ``set-priority``
- :mod:`~trainhouse.cli.session`: ``login``, ``logout``, ``whoami``
- :mod:`~trainhouse.cli.spec`: ``spec``
- :mod:`~trainhouse.cli.jobs`: ``submit``, ``ps``, ``show``, ``cancel``
- :mod:`~trainhouse.cli.outputs`: ``logs``, ``metrics``, ``checkpoints``
- :mod:`~trainhouse.cli.artifacts`: ``artifacts``
- :mod:`~trainhouse.cli.runs`: ``tag``, ``note``, ``project``, ``archive``, ``delete``, ``compare``
- :mod:`~trainhouse.cli.lineage`: ``resume``, ``clone``
- :mod:`~trainhouse.cli.top`: ``top``
- :mod:`~trainhouse.cli.models`: ``models list/show/register/alias/download/delete``
- :mod:`~trainhouse.cli.datasets`: ``datasets add/list/show/rm``
- :mod:`~trainhouse.cli.flows`: ``flows [list]/show/cancel/resume`` (``submit FLOW.yaml``)
- :mod:`~trainhouse.cli.admin`: ``admin init/user/token/quota/audit``
- :mod:`~trainhouse.cli.db`: ``db upgrade/current``
- :mod:`~trainhouse.cli.envs`: ``envs list/prune``
- :mod:`~trainhouse.cli.search`: ``search ...``
- :mod:`~trainhouse.cli.serve`: ``serve NAME@ALIAS``, ``serve list/show/stop``
"""

from __future__ import annotations

import typer

from trainhouse.cli.lazy import LazyGroup, Listed

# every command, in the order `trainhouse --help` lists them, with the line it shows for each
# (the first paragraph of the command's help; tests/unit/test_cli.py says what to write here
# when a command or its help changes)
COMMANDS: dict[str, Listed] = {
    "server": Listed("server", "Run the trainhouse server in the foreground."),
    "demo": Listed(
        "server",
        "The quick start: start a server, train the digits example, show the results, and keep\n"
        "the server (and its dashboard) running until Ctrl-C.",
    ),
    "queue": Listed(
        "queue", "Waiting jobs in the scheduler's decision order, each with why it waits."
    ),
    "set-priority": Listed("queue", "Change a queued job's priority tier."),
    "login": Listed(
        "session",
        "Check a token against the server and store it for it (0600, this user only).",
    ),
    "logout": Listed(
        "session",
        "Forget the stored token for the server (it stays valid: revoke it to end it).",
    ),
    "whoami": Listed("session", "Who the server takes you for."),
    "spec": Listed(
        "spec",
        "Print the job spec's JSON Schema, or validate a spec file and print it resolved.",
    ),
    "submit": Listed(
        "jobs",
        "Upload the workdir and spec, then follow the job until it ends (Ctrl-C detaches).",
    ),
    "ps": Listed("jobs", "List jobs (queued and running; --all or --where for ended ones too)."),
    "show": Listed("jobs", "A job's state, attempts, exit codes, placement, and why it waits."),
    "cancel": Listed("jobs", "Stop a job and every process it started."),
    "logs": Listed(
        "outputs",
        "Print a job's logs: every rank's, interleaved in the order they were written and\n"
        "prefixed with their rank, unless --rank is given; -f follows them live.",
    ),
    "metrics": Listed(
        "outputs",
        "The metrics a job reported: a summary per series (--json for every point).",
    ),
    "checkpoints": Listed(
        "outputs",
        "A job's checkpoints with step, size and digest; --download STEP DIR fetches one.",
    ),
    "artifacts": Listed(
        "artifacts",
        "A job's artifacts with their sizes; --download PATH DIR fetches a file or directory.",
    ),
    "tag": Listed("runs", "Add tags to a job (or take them off); with none, print its tags."),
    "note": Listed(
        "runs",
        "Set a job's note (markdown, shown on its page and by `show`); with no text, print it.",
    ),
    "project": Listed("runs", "Move jobs to another project (the runs table filters by it)."),
    "archive": Listed(
        "runs",
        "Archive ended jobs: kept, but left out of `ps` and the job list (`ps --archived`).",
    ),
    "delete": Listed(
        "runs", "Delete ended jobs for good: their logs, checkpoints, metrics and records."
    ),
    "compare": Listed(
        "runs",
        "Jobs side by side in numbers: per metric, each job's final value, best (lower or\n"
        "higher, by the metric's goal), min, max and the mean of its last N points.",
    ),
    "resume": Listed(
        "lineage",
        "Send a canceled or failed job back to the queue: the same job continues from its\n"
        "latest good checkpoint (refused with the reason when it has none), then follow it.",
    ),
    "clone": Listed(
        "lineage",
        "A new job with JOB's code (no upload) and spec plus the --set overrides, optionally\n"
        "starting from a verified copy of one of JOB's checkpoints; then follow it.",
    ),
    "top": Listed(
        "top",
        "Live resource use: each node's CPU, memory and GPUs, each running job's processes'\n"
        "CPU, RSS and GPU memory (Ctrl-C quits).",
    ),
    "models": Listed(
        "models", "The model registry: versions a job saved, aliases, downloads.", group=True
    ),
    "datasets": Listed(
        "datasets",
        "Datasets: versions in any storage, pinned by jobs, staged per node.",
        group=True,
    ),
    "flows": Listed(
        "flows",
        "Flows: jobs submitted together as steps (train, evaluate, promote), each waiting for "
        "the steps it names.",
        group=True,
    ),
    "admin": Listed(
        "admin",
        "Administration: the first admin (init), users, API tokens, the audit log, and "
        "per-user quotas and fair-share weights.",
        group=True,
    ),
    "db": Listed(
        "db",
        "The server's database: its schema revision, and upgrades to this trainhouse's.",
        group=True,
    ),
    "envs": Listed(
        "envs", "The jobs' environments cached on the server's machine (admins).", group=True
    ),
    "search": Listed(
        "search", "Hyperparameter searches (submit a spec with a search: block)", group=True
    ),
    "serve": Listed(
        "serve",
        "Serve a model version (NAME@ALIAS follows the alias): serve NAME@ALIAS, serve list, "
        "serve show NAME, serve stop NAME",
        group=True,
    ),
}


class _Commands(LazyGroup):
    listed = COMMANDS


app = typer.Typer(
    name="trainhouse",
    cls=_Commands,
    help="A self-hosted training server: submit PyTorch jobs, watch them train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Nothing to do before a command: typer makes a group only of an app with a callback or
    commands of its own, and this app's commands are all in the table."""
