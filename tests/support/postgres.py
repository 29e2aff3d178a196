"""The PostgreSQL server the tests use (the machine's, trust auth)."""

from __future__ import annotations

import os

PG_ADMIN = os.environ.get("TRAINHOUSE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def pg_url_of(name: str) -> str:
    """The SQLAlchemy URL of the database ``name`` on the tests' PostgreSQL."""
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{name}"
