"""Migration 0008: checkpoints registered before digests named their algorithm are sha256."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from tests.support.records import old_store
from trainhouse.store import Store


def test_checkpoints_from_before_0008_are_sha256_and_new_ones_keep_theirs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = old_store(url, "0007")
    with old.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO checkpoints (job_id, attempt, step, path, size, sha256, metrics, "
                "created_at, deleted, kind) VALUES (1, 1, 5, 'step-000000005.pt', 3, :digest, "
                "'{}', 0, 0, 'file')"
            ),
            {"digest": "a" * 64},
        )
    old.close()
    store = Store(url)
    try:
        (before,) = store.checkpoints.list(1)
        assert before.algorithm == "sha256" and before.sha256 == "a" * 64
        added = store.checkpoints.add(
            1,
            attempt=1,
            step=6,
            path="step-000000006.pt",
            size=3,
            sha256="b" * 64,
            algorithm="blake3",
        )
        assert added.algorithm == "blake3"
        assert [c.algorithm for c in store.checkpoints.list(1)] == ["sha256", "blake3"]
    finally:
        store.close()
