"""The database under the store: one engine for SQLite (WAL, synchronous FULL) or PostgreSQL
(psycopg 3, a pool sized for the server's request threads), its Alembic schema, and the public
transaction every repository writes in (:meth:`Database.transaction`).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import SQLAlchemyError

from trainhouse.core.errors import StoreError

__all__ = ["MIGRATE_MODES", "Database", "MigrateMode", "SchemaStatus", "default_db_url"]


def default_db_url(home: Path) -> str:
    return f"sqlite:///{home / 'trainhouse.db'}"


def _without_password(url: str) -> str:
    """A database URL with its password hidden (as SQLAlchemy shows it), parsable or not."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL: a commit (a submitted job, a stored metric batch) is on disk before it is
    # acknowledged, even if the machine loses power; NORMAL in WAL mode may lose the last ones
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _private_file(database: str | None) -> None:
    """Create a SQLite database file that does not exist yet readable by its user only (SQLite
    gives its -wal and -shm files the database's mode): it holds every token hash."""
    if database in (None, "", ":memory:") or database.startswith("file:"):
        return
    # it may exist, or its directory not: SQLite then says what is wrong, if anything
    with suppress(OSError):
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


#: the transaction open in this thread or task, and its database (:meth:`Database.transaction`)
_open: ContextVar[tuple[Database, Connection] | None] = ContextVar("trainhouse_tx", default=None)

MigrateMode = Literal["always", "auto", "never"]
MIGRATE_MODES: tuple[str, ...] = get_args(MigrateMode)


@dataclass(frozen=True)
class SchemaStatus:
    """Where a database's schema stands against the migrations this trainhouse ships."""

    revision: str | None  # the database's Alembic revision; None: no trainhouse schema yet
    head: str  # the newest revision this trainhouse knows
    known: bool  # whether this trainhouse knows the database's revision (None counts as known)

    @property
    def up_to_date(self) -> bool:
        return self.revision == self.head

    @property
    def needs_upgrade(self) -> bool:
        return self.known and not self.up_to_date


class Database:
    """A SQLAlchemy engine on SQLite or PostgreSQL, its schema, and transactions.

    Thread-safe: every :meth:`transaction` and :meth:`connect` takes its own connection.
    """

    def __init__(self, url: str, *, migrate: bool | MigrateMode = True) -> None:
        """Open the database at ``url`` and bring its schema to this trainhouse's head.

        ``migrate`` says what happens to a schema older than this code's: ``"always"`` (or
        True) applies the missing migrations; ``"auto"`` applies them on SQLite (the embedded
        default: a newcomer never runs a command) and refuses any other database (upgrading a
        production database is the operator's explicit step, ``trainhouse db upgrade``);
        ``"never"`` (or False) neither checks nor migrates (the caller handles the schema).
        A revision this code does not know (a newer trainhouse migrated the database) is
        refused in every mode but ``"never"``.
        """
        mode = "always" if migrate is True else "never" if migrate is False else migrate
        if mode not in MIGRATE_MODES:
            raise ValueError(f"migrate must be one of {', '.join(MIGRATE_MODES)}, got {mode!r}")
        self.url = url
        self.dialect = url.split(":", 1)[0].split("+", 1)[0]
        kwargs: dict[str, Any] = {}
        if self.dialect == "sqlite":
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
            # request threads (up to 40 in the server's pool) each need a connection: with
            # SQLAlchemy's default 5 + 10 they queued for one under load (bench/load.py)
            kwargs["pool_size"] = 20
            kwargs["max_overflow"] = 20
            if self.dialect == "postgresql" and "connect_timeout" not in url:
                kwargs["connect_args"] = {"connect_timeout": 10}  # an unreachable host fails
        try:
            self.engine: Engine = create_engine(url, **kwargs)
        except Exception as exc:  # bad URL, missing driver
            shown = _without_password(url)
            detail = str(exc).replace(url, shown)  # a bad URL is quoted whole
            raise StoreError(f"cannot open database {shown!r}: {detail}") from None
        #: the URL with its password hidden, for messages and logs
        self.safe_url = self.engine.url.render_as_string(hide_password=True)
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            if mode != "never":
                _private_file(self.engine.url.database)
        if mode != "never":
            try:
                self.prepare_schema(upgrade=mode == "always" or self.dialect == "sqlite")
            except BaseException:
                self.engine.dispose()
                raise

    # -- schema ----------------------------------------------------------------------------
    def alembic_config(self) -> Config:
        cfg = Config()
        cfg.set_main_option(
            "script_location", str(resources.files("trainhouse.store") / "migrations")
        )
        cfg.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        return cfg

    @staticmethod
    def _reason(exc: SQLAlchemyError) -> str:
        """The driver's message on one line (psycopg's span several)."""
        cause = getattr(exc, "orig", None) or exc
        return " ".join(str(cause).split())

    def schema_status(self) -> SchemaStatus:
        """The database's Alembic revision against this code's head (reads, never writes)."""
        script = ScriptDirectory.from_config(self.alembic_config())
        known = {rev.revision for rev in script.walk_revisions()}
        try:
            with self.engine.connect() as conn:
                current = MigrationContext.configure(conn).get_current_heads()
        except SQLAlchemyError as exc:
            raise StoreError(
                f"cannot reach the database {self.safe_url}: {self._reason(exc)}"
            ) from None
        return SchemaStatus(
            revision=",".join(current) or None,
            head=",".join(script.get_heads()),
            known=all(rev in known for rev in current),
        )

    def _refuse_unknown(self, status: SchemaStatus) -> None:
        if not status.known:
            raise StoreError(
                f"database schema is at revision {status.revision}, which this trainhouse "
                f"(head {status.head}) does not know; it was migrated by a newer trainhouse: "
                "upgrade trainhouse, or point --db at another database"
            )

    def prepare_schema(self, *, upgrade: bool) -> SchemaStatus:
        """Check the schema; migrate an older one to head if ``upgrade``, else refuse it."""
        status = self.schema_status()
        self._refuse_unknown(status)
        if status.up_to_date:
            return status
        if not upgrade:
            raise StoreError(
                f"database at revision {status.revision or 'none (no trainhouse schema yet)'} "
                f"needs upgrading to {status.head}: run "
                f"`trainhouse db upgrade --db {shlex.quote(self.safe_url)}`"
            )
        self._migrate("head")
        return SchemaStatus(revision=status.head, head=status.head, known=True)

    def upgrade(self, revision: str = "head") -> None:
        """Apply every Alembic migration not yet applied up to ``revision`` (idempotent).

        Refuses a database at a revision this code does not know (a newer trainhouse's).
        """
        self._refuse_unknown(self.schema_status())
        self._migrate(revision)

    def _migrate(self, revision: str) -> None:
        """Run Alembic's upgrade on one connection.

        On SQLite, foreign keys are off while migrations run: a table rebuilt by a batch
        migration must not cascade-delete the rows that point at it.
        """
        cfg = self.alembic_config()
        try:
            with self.engine.connect() as conn:
                if self.dialect == "sqlite":
                    conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
                    conn.commit()
                try:
                    with conn.begin():
                        cfg.attributes["connection"] = conn
                        command.upgrade(cfg, revision)
                finally:
                    if self.dialect == "sqlite":
                        conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                        conn.commit()
        except SQLAlchemyError as exc:
            raise StoreError(
                f"cannot upgrade the database {self.safe_url} to {revision}: {self._reason(exc)}"
            ) from None

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection in a transaction: committed when the block ends, rolled back if it
        raises. Every write of the repositories happens in one.

        Inside an open transaction of this database (in this thread or task), a nested one
        joins it: a use case wraps the repository calls of one action (the change and its
        audit entry) in one transaction, and they commit or roll back together."""
        joined = _open.get()
        if joined is not None and joined[0] is self:
            yield joined[1]
            return
        with self.engine.begin() as conn:
            token = _open.set((self, conn))
            try:
                yield conn
            finally:
                _open.reset(token)

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection for reads (no transaction is committed); inside an open transaction,
        that transaction's, so a use case reads what it has written."""
        joined = _open.get()
        if joined is not None and joined[0] is self:
            yield joined[1]
            return
        with self.engine.connect() as conn:
            yield conn
