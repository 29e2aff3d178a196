"""bench/load.py with tiny parameters: it runs against both stores and counts every point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "load.py"


def test_load_bench_loses_no_point_on_either_store(pg_server: str) -> None:
    args = ["--clients", "4", "--duration", "3", "--quiet-wait", "0", "--pg", pg_server]
    result = subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    for backend in ("postgresql", "sqlite"):
        assert f"{backend}: lost points: 0 " in out, out
        row = next(line.split() for line in out.splitlines() if line.startswith(f"  {backend} "))
        assert row[1] == "4" and int(row[2].replace(",", "")) > 0, out  # clients, requests
    assert "PostgreSQL/SQLite: points/s" in out, out
    assert "dropped the scratch database trainhouse_bench_" in result.stderr
