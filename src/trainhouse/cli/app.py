"""The ``trainhouse`` command: the root typer app, assembled from one app per noun.

The nouns' commands are merged into the root in the order ``trainhouse --help`` lists them
(``add_typer`` without a name makes a sub-app's commands top-level); ``models``, ``admin`` and
``db`` stay groups. Each noun module imports only what its commands need to start: the client,
the spec, the server and the store load inside the commands that use them, so
``trainhouse --help`` and ``trainhouse ps`` start fast.

- :mod:`~trainhouse.cli.server`: ``server``, ``demo``
- :mod:`~trainhouse.cli.queue`: ``queue``, ``set-priority``
- :mod:`~trainhouse.cli.session`: ``login``, ``logout``, ``whoami``
- :mod:`~trainhouse.cli.spec`: ``spec``
- :mod:`~trainhouse.cli.jobs`: ``submit``, ``ps``, ``show``, ``cancel``
- :mod:`~trainhouse.cli.outputs`: ``logs``, ``metrics``, ``checkpoints``
- :mod:`~trainhouse.cli.lineage`: ``resume``, ``clone``
- :mod:`~trainhouse.cli.runs`: ``tag``, ``note``, ``archive``, ``delete``
- :mod:`~trainhouse.cli.top`: ``top``
- :mod:`~trainhouse.cli.models`: ``models list/show/register/alias/download/delete``
- :mod:`~trainhouse.cli.datasets`: ``datasets add/list/show/rm``
- :mod:`~trainhouse.cli.serve`: ``serve NAME@ALIAS``, ``serve list/show/stop``
- :mod:`~trainhouse.cli.admin`: ``admin init/user/token/quota/audit``
- :mod:`~trainhouse.cli.db`: ``db upgrade/current``
"""

from __future__ import annotations

import typer

from trainhouse.cli import (
    admin,
    datasets,
    db,
    envs,
    jobs,
    lineage,
    models,
    outputs,
    queue,
    runs,
    search,
    serve,
    server,
    session,
    spec,
    top,
)

app = typer.Typer(
    name="trainhouse",
    help="A self-hosted training server: submit PyTorch jobs, watch them train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for noun in (server, queue, session, spec, jobs, outputs, runs, lineage, top):
    app.add_typer(noun.app)
app.add_typer(models.app, name="models")
app.add_typer(datasets.app, name="datasets")
app.add_typer(admin.app, name="admin")
app.add_typer(db.app, name="db")
app.add_typer(envs.app, name="envs")
app.add_typer(search.app, name="search")
app.add_typer(serve.app, name="serve")
