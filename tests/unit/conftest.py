"""Store fixtures: every store test runs on SQLite and on the real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trainhouse.store import Store


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'trainhouse.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    s = Store(url)
    try:
        yield s
    finally:
        s.close()
