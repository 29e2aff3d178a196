"""Unit-tier fixtures: the store on SQLite and on the real PostgreSQL, and the app in process.

``api`` runs the real app over the suite's fake executor (jobs "run" without processes);
``real_api`` over the local executor, for the few tests about what real ranks leave behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.api import app_client
from tests.support.templates import migrated_sqlite
from trainhouse.store import Store


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated store on each backend (a copy: tests.support.templates)."""
    if request.param == "sqlite":
        url = migrated_sqlite(tmp_path / "trainhouse.db")
    else:
        url = request.getfixturevalue("pg_migrated_url")
    s = Store(url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    """The app in process over a fake executor: a submitted job completes at the next tick."""
    with app_client(tmp_path) as client:
        yield client


@pytest.fixture
def real_api(tmp_path: Path) -> Iterator[TestClient]:
    """The app in process over the local executor: jobs run as real torchrun ranks."""
    with app_client(tmp_path, real=True) as client:
        yield client
