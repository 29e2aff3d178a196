"""The PostgreSQL server the tests use (the machine's, trust auth)."""

from __future__ import annotations

import os
import uuid

import psycopg

PG_ADMIN = os.environ.get("TRAINHOUSE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def pg_url_of(name: str) -> str:
    """The SQLAlchemy URL of the database ``name`` on the tests' PostgreSQL."""
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{name}"


def create_database(prefix: str = "trainhouse_test", *, template: str | None = None) -> str:
    """A new database on the tests' PostgreSQL, empty or a copy of ``template``; its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    return name


def drop_database(name: str) -> None:
    """Drop the database ``name`` (whoever is still connected to it), if it is there."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
