"""Staging ahead (:mod:`trainhouse.ingest.prefetch`): the versions of the next queued jobs go
into the machine's cache and stay held there, safe from eviction, until those jobs leave the
queue; one that cannot be staged is left to the attempt."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from trainhouse.core.lifecycle import JobState
from trainhouse.core.spec import JobSpec
from trainhouse.ingest.datasetfiles import DatasetFiles
from trainhouse.ingest.prefetch import DatasetPrefetch
from trainhouse.store import Store


def _upload(files: DatasetFiles, store: Store, name: str, content: bytes) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("data.bin")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    buf.seek(0)
    manifest = files.store_upload(buf, 1 << 20)
    store.datasets.add_version(
        name,
        owner="ana",
        digest=manifest.digest,
        source=None,
        storage_options={},
        files=1,
        size=manifest.size,
        checksums="sha256",
        description=None,
    )
    return manifest.digest


def _job(store: Store, datasets: dict[str, str]) -> int:
    spec = JobSpec(entrypoint="python train.py", datasets=datasets)
    return store.jobs.create(
        name="j", owner="ana", priority="normal", spec=spec, archive_sha256="0" * 64
    ).id


def test_the_next_jobs_versions_are_staged_and_held_until_they_leave_the_queue(
    store: Store, tmp_path: Path
) -> None:
    files = DatasetFiles(tmp_path / "datasets")
    first = _upload(files, store, "a", b"a" * 1000)
    second = _upload(files, store, "b", b"b" * 1000)
    job = _job(store, {"x": "a"})
    _job(store, {"y": "b"})
    prefetch = DatasetPrefetch(store, files, tmp_path / "cache", 0, interval=60)
    assert prefetch.tick() == 2
    views = {v.digest: v for v in prefetch.cache.usage()}
    assert views[first].in_use and views[second].in_use
    assert prefetch.cache.prune(0) == []  # held: nothing evicted
    assert prefetch.tick() == 0  # nothing new

    store.jobs.transition(job, JobState.CANCELED, reason="test")  # out of the queue
    prefetch.tick()
    assert [v.digest for v in prefetch.cache.prune(0)] == [first]
    prefetch.on_stop()
    assert [v.digest for v in prefetch.cache.prune(0)] == [second]


def test_a_version_that_cannot_be_staged_is_left_to_the_attempt(
    store: Store, tmp_path: Path
) -> None:
    files = DatasetFiles(tmp_path / "datasets")
    digest = _upload(files, store, "a", b"a" * 100)
    files.remove_unused(files.manifest(digest), lambda _entry: False)  # its bytes are gone
    _job(store, {"x": "a"})
    prefetch = DatasetPrefetch(store, files, tmp_path / "cache", 0, interval=60)
    assert prefetch.tick() == 0 and prefetch.tick() == 0  # tried once, then left alone
    assert prefetch.cache.usage() == []
