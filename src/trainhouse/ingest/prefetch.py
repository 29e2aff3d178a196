"""Staging ahead: the dataset versions of the jobs next in line go into this machine's cache
while the jobs before them still run, so a warm start waits for nothing.

With the local executor every job runs on the server's machine, whose cache
(:mod:`trainhouse.jobfs.datacache`) the attempts' supervisors stage into. This loop looks at the
queue every few seconds and stages, for the first :data:`AHEAD` queued jobs that pin datasets
(in the order the scheduler starts them: priority, then age), every version not in the cache
yet: from its URL (the server's own credentials) or from the server's dataset storage, each
file verified as the supervisor's staging does. The supervisor then finds it ready and fetches
nothing. Until then the loop holds each such version in use, so that staging another one cannot
evict it. A failure is logged and left to the attempt, which reports it with its reason.

On Ray the nodes a job will run on are known only when it is placed; their supervisors stage
then (this loop is off).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from trainhouse.core.background import BackgroundLoop
from trainhouse.core.datasets import FileEntry
from trainhouse.core.lifecycle import JobState
from trainhouse.core.spec import PRIORITY_TIERS
from trainhouse.ingest.datasetfiles import DatasetFiles
from trainhouse.jobfs import datasources
from trainhouse.jobfs.datacache import DataCache, Staged
from trainhouse.store import Store

__all__ = ["AHEAD", "DatasetPrefetch"]

log = logging.getLogger(__name__)

AHEAD = 2  # queued jobs whose versions are staged ahead
INTERVAL = 3.0  # seconds between two looks at the queue


class DatasetPrefetch(BackgroundLoop):
    """Stages the versions the next queued jobs pin into ``cache`` (see the module)."""

    name = "trainhouse-dataset-prefetch"

    def __init__(
        self,
        store: Store,
        files: DatasetFiles,
        cache: Path,
        cache_bytes: int,
        *,
        enabled: bool = True,
        interval: float = INTERVAL,
    ) -> None:
        super().__init__(interval)
        self.store = store
        self.files = files
        self.cache = DataCache(cache, cache_bytes)
        self._enabled = enabled
        self._failed: set[str] = set()  # digests that failed: left to the attempts
        self._held: dict[str, Staged] = {}  # versions staged ahead, held until their job starts

    @property
    def enabled(self) -> bool:
        return self._enabled

    def next_in_line(self) -> list[int]:
        """The first :data:`AHEAD` queued jobs (not held) that pin datasets, in start order."""
        queued = [j for j in self.store.jobs.list(states=[JobState.QUEUED]) if not j.held]
        queued.sort(key=lambda j: (-PRIORITY_TIERS.index(j.priority), j.created_at, j.id))
        pins = self.store.datasets.pins_of(j.id for j in queued)
        return [j.id for j in queued if pins.get(j.id)][:AHEAD]

    def tick(self) -> int:
        """Stage what the next jobs pin, and hold it in use until they start or leave the
        queue (no stage of another version evicts it meanwhile); how many versions this look
        staged."""
        staged = 0
        wanted: set[str] = set()
        for job_id in self.next_in_line():
            request = self.store.datasets.stage_request(job_id)
            for source in request.sources if request is not None else ():
                digest = source.pin.digest
                wanted.add(digest)
                if digest in self._failed or digest in self._held:
                    continue
                try:
                    manifest = self.files.manifest(digest)
                    fetch = self._fetcher(source.url, dict(source.storage_options))
                    fresh = not self.cache.is_ready(digest)
                    self._held[digest] = self.cache.stage(manifest, fetch)
                    if fresh:
                        staged += 1
                        log.info("staged %s ahead of job %s", source.pin.ref, job_id)
                except Exception as exc:  # the attempt stages it again and says why it fails
                    self._failed.add(digest)
                    log.warning("could not stage %s ahead: %s", source.pin.ref, exc)
        for digest in set(self._held) - wanted:  # started (its attempt holds it) or gone
            self._held.pop(digest).release()
        return staged

    def on_stop(self) -> None:
        for held in self._held.values():
            held.release()
        self._held.clear()

    def _fetcher(
        self, url: str | None, options: dict[str, str]
    ) -> Callable[[FileEntry], contextlib.AbstractContextManager[Any]]:
        if url is not None:
            return lambda entry: datasources.open_file(url, options, entry.path, entry.size)

        @contextlib.contextmanager
        def stored(entry: FileEntry) -> Iterator[IO[bytes]]:
            with self.files.open(entry) as fh:
                yield fh

        return stored
