"""Finding the checkpoint to resume from: the server's list, the storage's records, checksums.

Names in the storage: ``step-XXXXXXXXX.pt`` (a file checkpoint), ``step-XXXXXXXXX/`` (a sharded
one), each with its record next to it (``<name>.json``); temp names (hidden, ``.tmp-PID-``) are
writes that were never published.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
from typing import Any

from trainhouse.core.errors import CheckpointError, ClientError
from trainhouse.jobfs.storage import EntryList, Storage, is_temp, new_hash, temp_pid, tree_digest
from trainhouse.sdk._distributed import DistributedContext
from trainhouse.sdk.checkpoint import _format as file_format
from trainhouse.sdk.checkpoint._registry import CheckpointRegistry
from trainhouse.sdk.checkpoint._support import Comm

log = logging.getLogger("trainhouse")

FILE = re.compile(r"^step-(\d+)\.pt$")
DIR = re.compile(r"^step-(\d+)$")
SIDECAR = re.compile(r"^(step-(\d+)(?:\.pt)?)\.json$")


def file_name(step: int) -> str:
    return f"step-{step:09d}.pt"


def dir_name(step: int) -> str:
    return f"step-{step:09d}"


class Finder:
    """The load side of :class:`~trainhouse.sdk.checkpoint.Checkpointer` (a mixin): the storage's
    records, checked against the registry's list."""

    _registry: CheckpointRegistry
    _dist: DistributedContext
    storage: Storage
    _verifying: Comm | None = None  # a load's collectives while the main rank verifies
    _read: tuple[str, Any] | None = None  # a verified file's path and bytes, for the load

    def _local_records(self) -> list[dict[str, Any]]:
        """Checkpoints found in the storage: sidecar records, then bare files/dirs (unverified)."""
        names = self.storage.list()
        records: dict[str, dict[str, Any]] = {}
        for name in names:
            match = SIDECAR.match(name)
            if match is None:
                continue
            target = match.group(1)
            record: dict[str, Any] | None = None
            with contextlib.suppress(OSError, ValueError):
                loaded = json.loads(self.storage.read_text(name))
                record = loaded if isinstance(loaded, dict) else None
            if record is None:  # unreadable record: the checkpoint itself, unverified
                record = {"step": int(match.group(2)), "path": target, "sha256": None}
            record["_sidecar"] = True
            records[target] = record
        for name in names:
            match = FILE.match(name) or DIR.match(name)
            if match is not None and name not in records:
                records[name] = {"step": int(match.group(1)), "path": name, "sha256": None}
        return list(records.values())

    def _candidates(self) -> list[dict[str, Any]]:
        """Known checkpoints, newest first: the server's, plus local ones it never heard of."""
        local = self._local_records()
        try:
            found = self._registry.listed()
        except ClientError as exc:
            log.warning(
                "trainhouse: cannot list checkpoints (%s); reading %s", exc, self.storage.url
            )
            found = None
        if found is not None:
            newest = max((int(c["step"]) for c in found), default=-1)
            extra = [
                dict(r, _unregistered=True)
                for r in local
                if r.get("_sidecar") and r.get("sha256") and int(r["step"]) > newest
            ]
            return sorted(
                [*found, *extra],
                key=lambda c: (int(c["step"]), c.get("id", math.inf)),
                reverse=True,
            )
        return sorted(local, key=lambda c: int(c["step"]), reverse=True)

    def _report_corrupt(self, cand: dict[str, Any], reason: str) -> None:
        if cand.get("id") is None:
            return
        try:
            self._registry.report_corrupt(cand["id"], reason)
        except ClientError as exc:
            if exc.status == 404:
                log.info("trainhouse: the server cannot take corrupt-checkpoint reports (%s)", exc)
            else:
                log.warning("trainhouse: could not report checkpoint %s: %s", cand["path"], exc)

    def _sweep_temps(self) -> None:
        """Remove temp files of saves whose process is gone (killed in the middle of a write)."""
        if self.storage.local_root is None:
            return
        for name in self.storage.list():
            pid = temp_pid(name) if is_temp(name) else None
            if pid is None or pid == os.getpid():
                continue
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                self.storage.delete(name)
            except OSError:
                pass

    def _find(self, comm: Comm) -> dict[str, Any] | None:
        """The checkpoint to resume from, on every rank (collective): the main rank looks for
        it (:meth:`latest`) while the others hash their share of each sharded candidate it
        verifies; raises CheckpointError on every rank if it cannot be found."""
        chosen: dict[str, Any] | None = None
        if self._dist.is_main:
            self._verifying = comm
            try:
                chosen = self.latest()
            except Exception as exc:  # tell the other ranks, which wait in the broadcast
                chosen = {"error": f"cannot find the latest checkpoint: {exc!r}"}
            finally:
                self._verifying = None
                if comm.active:
                    comm.broadcast(None)  # the others stop hashing with the main rank
        elif comm.active:
            while (listing := comm.broadcast(None)) is not None:
                path, files = listing
                comm.all_gather(self._hash_share(path, files, comm))
        chosen = comm.broadcast(chosen)
        if chosen is not None and "error" in chosen:
            raise CheckpointError(chosen["error"])
        return chosen

    def _hash_share(self, rel: str, listing: list[tuple[str, int]], comm: Comm) -> EntryList:
        """(relpath, sha256, size) of this rank's share of the files of directory ``rel``."""
        return self.storage.hash_files(rel, listing[comm.rank :: comm.world_size])

    def _digest(self, cand: dict[str, Any]) -> str:
        """The digest (the record's ``algorithm``, sha256 where it names none) of a candidate as
        it is in the storage (a sha256 tree digest for a directory): while :meth:`_find` runs on
        several ranks, every rank hashes its share of a sharded candidate's files. A local file
        is read once, into memory, hashed as it is read; a file in the trainhouse format is kept
        (:attr:`_read`) for the load that follows, which then reads nothing."""
        comm = self._verifying
        path = cand["path"]
        algorithm = str(cand.get("algorithm") or "sha256")
        self._read = None
        if self.storage.is_dir(path):
            if comm is None or not comm.active:
                return self.storage.digest(path)
            listing = self.storage.files(path)
            comm.broadcast((path, listing))
            parts = comm.all_gather(self._hash_share(path, listing, comm))
            return tree_digest([entry for part in parts for entry in part])
        if self.storage.local_root is not None:
            hasher = new_hash(algorithm)
            with self.storage.open_read(path) as fh:
                if file_format.is_ours(fh.read(len(file_format.MAGIC))):
                    size = fh.seek(0, 2)
                    fh.seek(0)
                    buf = file_format.read_buffer(fh, size, hasher)
                    digest = str(hasher.hexdigest())
                    if digest == cand.get("sha256") and comm is not None:  # a load's _find
                        self._read = (path, buf)
                    return digest
        return self.storage.digest(path, algorithm=algorithm)

    def latest(self) -> dict[str, Any] | None:
        """The newest checkpoint that exists and whose sha256 matches, or None.

        Corrupt or missing ones the server listed are reported to it; a verified one the server
        never registered (written while it was unreachable) is registered now.
        """
        with contextlib.suppress(OSError):
            self._sweep_temps()
        for cand in self._candidates():
            path = cand["path"]
            where = self.storage.location(path)
            if not self.storage.exists(path):
                log.warning("trainhouse: checkpoint %s is missing; trying an older one", where)
                self._report_corrupt(cand, f"missing: {where} does not exist")
                continue
            if not cand.get("kind"):  # records written before kinds existed
                cand["kind"] = "sharded" if self.storage.is_dir(path) else "file"
            if cand.get("sha256") is None:  # copied in by hand, without its record
                log.warning(
                    "trainhouse: checkpoint %s has no recorded sha256; loading it unverified", where
                )
                return self._chosen(cand)
            algorithm = str(cand.get("algorithm") or "sha256")
            try:
                actual = self._digest(cand)
            except CheckpointError as exc:  # an unknown algorithm, a truncated read
                actual = f"unreadable ({exc})"
            if actual != cand["sha256"]:
                log.error(
                    "trainhouse: checkpoint %s is corrupt (%s %s, expected %s); "
                    "trying an older one",
                    where,
                    algorithm,
                    actual[:12],
                    cand["sha256"][:12],
                )
                self._report_corrupt(
                    cand,
                    f"{algorithm} mismatch: {where} has {actual}, expected {cand['sha256']}",
                )
                continue
            return self._chosen(cand)
        return None

    def _chosen(self, cand: dict[str, Any]) -> dict[str, Any]:
        if cand.pop("_unregistered", False):  # only where the registry listed checkpoints
            record = {k: v for k, v in cand.items() if not k.startswith("_")}
            try:
                cand = {**self._registry.register(record), "kind": record["kind"]}
                log.warning("trainhouse: registered checkpoint %s, found on disk", record["path"])
            except ClientError as exc:
                log.warning("trainhouse: could not register %s: %s", record["path"], exc)
        return {k: v for k, v in cand.items() if not k.startswith("_")}
