"""Migrated databases, made once per test process and copied for each test that needs one.

Every Alembic migration run on an empty database costs about half a second (more on a busy
machine), and most unit tests start from an empty store: an app in process, a store on each
backend. They start instead from a copy of one database that this process migrated from empty
with the real migrations (a file copy on SQLite, ``CREATE DATABASE ... TEMPLATE`` on
PostgreSQL): the same schema, which ``test_store.py::test_migrated_schema_matches_tables``
checks against the tables on each backend. Tests of the migrations themselves, of
``trainhouse db upgrade`` and of a server's first start in an empty home make their own
databases and run the migrations as before.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path

from tests.support.postgres import create_database, drop_database, pg_url_of
from trainhouse.store import Store

_lock = threading.Lock()
#: where this process keeps its SQLite template: a directory of pytest's temp root, which the
#: suite's conftest names at the session's start (a process that imports this module makes
#: nothing until it asks for a database)
_where: list[Path] = []
_made: dict[str, str] = {}  # "sqlite": the template's path; "postgresql": its database's name


def keep_templates_in(directory: Path) -> None:
    _where[:] = [directory]


def _sqlite_template() -> Path:
    with _lock:
        if "sqlite" not in _made:
            if not _where:  # a child process a test started: its own, gone when it exits
                _where.append(Path(tempfile.mkdtemp(prefix="trainhouse-templates-")))
                atexit.register(shutil.rmtree, _where[0], True)
            path = _where[0] / "template.db"
            Store(f"sqlite:///{path}").close()
            # the last connection's close checkpoints the WAL into the file and removes it
            leftovers = [p.name for p in _where[0].iterdir() if p != path]
            assert not leftovers, f"the SQLite template left {leftovers}"
            _made["sqlite"] = str(path)
        return Path(_made["sqlite"])


def migrated_sqlite(path: Path) -> str:
    """A migrated SQLite database at ``path`` (private, as the server makes its own); its URL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_sqlite_template(), path)
    os.chmod(path, 0o600)
    return f"sqlite:///{path}"


def migrated_home(home: Path) -> Path:
    """A server home (private) whose embedded database is migrated already."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (home / "trainhouse.db").exists():
        migrated_sqlite(home / "trainhouse.db")
    return home


def pg_template() -> str:
    """The name of this process's migrated PostgreSQL database, for ``create_database``'s
    ``template`` (made on first use; no connection to it stays open: it is copied)."""
    with _lock:
        if "postgresql" not in _made:
            name = create_database("trainhouse_template")
            Store(pg_url_of(name)).close()
            _made["postgresql"] = name
        return _made["postgresql"]


def drop_templates() -> None:
    """Drop this process's PostgreSQL template and remove its SQLite one (session end)."""
    with _lock:
        if "postgresql" in _made:
            drop_database(_made["postgresql"])
        if "sqlite" in _made:
            Path(_made["sqlite"]).unlink(missing_ok=True)
        _made.clear()
