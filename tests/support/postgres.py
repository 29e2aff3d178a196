"""The PostgreSQL server the tests use (the machine's, trust auth)."""

from __future__ import annotations

import os

PG_ADMIN = os.environ.get("TRAINHOUSE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
