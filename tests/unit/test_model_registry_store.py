"""The model registry in the store (SQLite and PostgreSQL): versions numbered per model,
idempotent registration, aliases that move, deletions refused while an alias names a version."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.records import new_job
from trainhouse.errors import ModelError, NotFound, StoreError
from trainhouse.store import Store


def files(tag: str) -> list[dict[str, Any]]:
    return [
        {"name": "program.pt2", "size": 10, "sha256": tag * 64},
        {"name": "model.json", "size": 5, "sha256": "f" * 64},
    ]


def add(store: Store, job_id: int, step: int, name: str = "digits") -> Any:
    return store.models.add_version(
        name,
        owner="alice",
        job_id=job_id,
        attempt=1,
        step=step,
        path=f"models/{name}/step-{step:09d}",
        kind="export",
        files=files("a"),
        metrics={"val_acc": 0.9},
        signature={"inputs": [{"name": "x", "shape": [None, 64], "dtype": "float32"}]},
    )


def test_versions_aliases_and_deletion(store: Store) -> None:
    job = new_job(store, name="train", owner="alice", spec={"entrypoint": "python t.py"})
    v1 = add(store, job, 5)
    assert (v1.model, v1.version, v1.size, v1.metrics) == ("digits", 1, 15, {"val_acc": 0.9})
    assert add(store, job, 5).version == 1  # the same files registered again
    v2 = add(store, job, 9)
    assert v2.version == 2
    assert add(store, job, 9, name="other").version == 1  # numbered per model

    store.models.set_alias("digits", "prod", 1)
    assert store.models.resolve("digits", "prod").version == 1
    store.models.set_alias("digits", "prod", 2)  # moved
    assert store.models.resolve("digits", "prod").version == 2
    assert store.models.resolve("digits", "latest").version == 2
    assert store.models.resolve("digits", "1").aliases == ()
    (model,) = [m for m in store.models.list() if m.name == "digits"]
    assert (model.versions, model.latest, model.aliases) == (2, 2, {"prod": 2})
    assert [v.job_id for v in store.models.for_job(job)] == [job, job, job]

    with pytest.raises(StoreError, match="named by the alias"):
        store.models.delete_version("digits", 2)
    assert store.models.delete_version("digits", 1).version == 1
    assert [v.version for v in store.models.versions("digits")] == [2]
    assert add(store, job, 11).version == 3  # numbers are never reused

    with pytest.raises(NotFound, match="no alias 'staging'"):
        store.models.resolve("digits", "staging")
    with pytest.raises(NotFound, match="no version 7"):
        store.models.set_alias("digits", "prod", 7)
    with pytest.raises(ModelError, match="cannot be a number"):
        store.models.set_alias("digits", "12", 2)
    with pytest.raises(ModelError, match="model name must be"):
        add(store, job, 1, name="../x")
    store.models.remove_alias("digits", "prod")
    assert store.models.delete_version("digits", 2).version == 2
    # nor is the newest's, deleted: NAME@3 never comes to mean another model
    assert store.models.delete_version("digits", 3).version == 3
    assert store.models.versions("digits") == []
    assert add(store, job, 13).version == 4
    assert store.models.get("digits").latest == 4
