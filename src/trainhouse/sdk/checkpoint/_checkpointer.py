"""``run.checkpoint``: save and load the training state, atomically, verified, resumable.

``save`` and ``load`` are collective: every rank calls them. Plain checkpoints are one file the
main rank writes (a replicated, DDP state); ``sharded=True`` writes a torch.distributed.checkpoint
directory, every rank its shard. Nothing is published under its final name, given a sidecar
record or registered with the server before every byte of it is written and fsynced.

The ranks coordinate a checkpoint over a gloo group of their own with a long timeout
(``_support.WAIT_TIMEOUT``), never over the job's NCCL group: while the main rank writes or hashes a
checkpoint of hundreds of GB the others wait there, and NCCL's 10-minute timeout would tear the
job down. A sharded checkpoint's files are hashed by every rank in parallel, each its share,
when it is saved and when it is verified before a load.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
from typing import TYPE_CHECKING, Any, Literal, overload

from trainhouse.core.errors import CheckpointError, ClientError, ServerUnreachable
from trainhouse.jobfs.storage import (
    FILE_DIGEST,
    EntryList,
    Storage,
    open_storage,
    sidecar_name,
    tree_digest,
)
from trainhouse.sdk._distributed import DistributedContext, SingleProcess
from trainhouse.sdk.checkpoint import _format as file_format
from trainhouse.sdk.checkpoint import _rng as rng_mod
from trainhouse.sdk.checkpoint import _sharded as shards
from trainhouse.sdk.checkpoint._finding import DIR, FILE, Finder, dir_name, file_name
from trainhouse.sdk.checkpoint._handle import SaveHandle, message_of
from trainhouse.sdk.checkpoint._registry import CheckpointRegistry, LocalRegistry
from trainhouse.sdk.checkpoint._safety import refuse_unloadable, safe_load
from trainhouse.sdk.checkpoint._support import (
    Comm,
    HashingWriter,
    Stager,
    disk_full_error,
    estimate_bytes,
    gloo_group,
    is_disk_full,
)

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger("trainhouse")

#: the key of a checkpoint file that holds trainhouse's own data (RNG states); never the user's
RESERVED = "_trainhouse"
# seconds a save waits for an unreachable server before it defers the registration
REGISTER_WAIT = 5.0


class Checkpointer(Finder):
    """``run.checkpoint``: save and load the training state.

    ``location`` is a local directory, a ``file://`` URL or any fsspec URL (see
    :mod:`trainhouse.jobfs.storage`). ``directory`` is the local directory, or None for a remote
    one. ``distributed`` is this rank's place among the ranks and their collectives (default: one
    process alone); ``registry`` is the server's side of checkpoints (default: no server, the
    records next to the checkpoints only).
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | Storage,
        *,
        distributed: DistributedContext | None = None,
        registry: CheckpointRegistry | None = None,
    ) -> None:
        self._dist = distributed if distributed is not None else SingleProcess()
        self._registry = registry if registry is not None else LocalRegistry()
        self.storage = open_storage(location)
        self.directory: Path | None = self.storage.local_root
        self._pending: SaveHandle | None = None
        # a background save was started since the ranks last agreed on their outcomes (saves are
        # collective, so every rank knows the same): only then do waits need a collective
        self._outstanding = False
        self._wait_group: Any = None  # gloo, WAIT_TIMEOUT: the checkpoints' own collectives
        self._bg_group: Any = None  # likewise, for background saves (another thread)
        self._stage = Stager()  # CPU buffers reused by background saves

    def _comm(self) -> Comm:
        """The collectives of a checkpoint operation: over the checkpoints' own gloo group
        (made by the first operation, which every rank calls), no-ops alone."""
        if self._dist.active and self._wait_group is None:
            self._wait_group = gloo_group()
        return Comm(self._dist, self._wait_group)

    # -- save ------------------------------------------------------------------------------
    @overload
    def save(
        self,
        state: dict[str, Any],
        *,
        step: int,
        metrics: dict[str, float] | None = None,
        rng: bool = True,
        sharded: bool = False,
        blocking: Literal[True] = True,
    ) -> dict[str, Any] | None: ...

    @overload
    def save(
        self,
        state: dict[str, Any],
        *,
        step: int,
        metrics: dict[str, float] | None = None,
        rng: bool = True,
        sharded: bool = False,
        blocking: Literal[False],
    ) -> SaveHandle: ...

    def save(
        self,
        state: dict[str, Any],
        *,
        step: int,
        metrics: dict[str, float] | None = None,
        rng: bool = True,
        sharded: bool = False,
        blocking: bool = True,
    ) -> dict[str, Any] | SaveHandle | None:
        """Write ``state`` as the checkpoint of ``step``. Collective: every rank calls it.

        - ``rng=True`` also stores every rank's RNG states (python, numpy, torch CPU and CUDA),
          which ``load`` restores; ``rng=False`` leaves them out.
        - ``sharded=True`` writes a torch.distributed.checkpoint directory, each rank its shard
          (FSDP/DTensor states); load it back with ``load(template_state)``.
        - ``blocking=False`` copies the state to CPU memory (the only time the loop waits),
          writes it in the background and returns a :class:`SaveHandle`. The next
          ``save``/``load``/``wait`` and ``run.finish()`` wait for it and raise its error.

        Returns the checkpoint's record on the main rank (None on the others), or a SaveHandle.
        A failed write raises CheckpointError on every rank and leaves earlier checkpoints as
        they were.
        """
        comm = self._comm()
        # one collective: the previous background save's outcome and every rank's RNG state
        rng_states: list[Any] | None = None
        if rng or self._outstanding:
            self._outstanding = False
            mine = (self._take_failure(), rng_mod.capture() if rng else None)
            gathered = comm.all_gather(mine)
            self._raise_first([g[0] for g in gathered], comm)
            rng_states = [g[1] for g in gathered] if rng else None
        if step < 0:
            raise CheckpointError(f"checkpoint step must be >= 0, got {step}")
        if not isinstance(state, dict):
            raise CheckpointError(f"a checkpoint state must be a dict, got {type(state).__name__}")
        if RESERVED in state:
            raise CheckpointError(f"the state key {RESERVED!r} is reserved for trainhouse")
        clean = {str(k): float(v) for k, v in (metrics or {}).items()}
        finite = {k: (v if math.isfinite(v) else None) for k, v in clean.items()}
        if sharded:
            return self._save_sharded(state, int(step), finite, rng_states, blocking, comm)
        payload = dict(state)
        if rng_states is not None:
            payload[RESERVED] = {"rng": rng_states}
        return self._save_file(payload, int(step), finite, blocking, comm)

    def _save_file(
        self,
        payload: dict[str, Any],
        step: int,
        metrics: dict[str, float | None],
        blocking: bool,
        comm: Comm,
    ) -> dict[str, Any] | SaveHandle | None:
        error: BaseException | None = None
        record: dict[str, Any] | None = None
        handle: SaveHandle | None = None
        if self._dist.is_main:
            try:
                if blocking:
                    record = self._write_file(payload, step, metrics)
                else:
                    staged = self._stage(payload)
                    handle = SaveHandle(step, lambda: self._write_file(staged, step, metrics))
            except BaseException as exc:  # keep the ranks in step, then raise below
                error = exc
        elif blocking:
            self._flush_other_rank()
        else:
            flush = self._flush_other_rank if self._registry.sends_metrics else None
            handle = SaveHandle(step, flush)
        if handle is not None:
            self._pending = handle
        self._outstanding = self._outstanding or not blocking
        message = comm.broadcast(message_of(error))
        if handle is not None:
            handle._release()
        if error is not None:
            raise error
        if message is not None:
            raise CheckpointError(f"rank 0: {message}")
        return record if blocking else handle

    def _flush_other_rank(self) -> None:
        with contextlib.suppress(ClientError):
            self._registry.flush_metrics()  # values other ranks logged with all_ranks=True
        return None

    def _write_file(
        self, payload: dict[str, Any], step: int, metrics: dict[str, float | None]
    ) -> dict[str, Any]:
        storage = self.storage
        name = file_name(step)
        tmp = storage.temp_name(name)
        writer: HashingWriter | None = None
        try:
            # tensors raw, the rest as JSON (see _format); None: the state holds what only
            # torch.save can write, which is then read back to refuse what cannot be loaded
            encoded = file_format.plan(payload)
            with storage.open_write(tmp) as fh, HashingWriter(fh, FILE_DIGEST) as writer:
                if encoded is not None:
                    encoded.write(writer.write)
                else:
                    import torch

                    torch.save(payload, writer)  # type: ignore[arg-type]
            if encoded is None:
                with storage.open_read(tmp) as fh:
                    refuse_unloadable(fh)
            del encoded
            storage.publish(tmp, name)
        except BaseException as exc:
            mapped = self._failed(exc, tmp, name, estimate_bytes(payload), writer)
            if mapped is exc:
                raise
            raise mapped from exc
        record = self._record(step, name, writer.size, writer.hexdigest(), metrics, "file")
        record["algorithm"] = writer.algorithm
        return self._commit(record)

    def _failed(
        self,
        exc: BaseException,
        tmp: str,
        name: str,
        needed: int,
        writer: HashingWriter | None = None,
    ) -> BaseException:
        """Remove the temp file; the error to raise (the disk-full one when the disk is full)."""
        free = self.storage.free_bytes()
        with contextlib.suppress(Exception):
            self.storage.delete(tmp)
        if isinstance(exc, CheckpointError):
            return exc
        full = is_disk_full(exc, free=free, needed=needed)
        if not full and writer is not None and writer.error is not None:
            full = is_disk_full(writer.error, free=free, needed=needed)
        if full:
            return disk_full_error(self.storage.location(name), free, needed, self._previous())
        return exc

    def _previous(self) -> str:
        """Which checkpoint is still intact (for the disk-full message)."""
        best: tuple[int, str] | None = None
        for name in self.storage.list():
            match = FILE.match(name) or DIR.match(name)
            if match and (best is None or int(match.group(1)) > best[0]):
                best = (int(match.group(1)), name)
        if best is None:
            return "there is no earlier checkpoint"
        return (
            f"the previous checkpoint {self.storage.location(best[1])} (step {best[0]}) is intact"
        )

    def _record(
        self,
        step: int,
        path: str,
        size: int,
        digest: str,
        metrics: dict[str, float | None],
        kind: str,
    ) -> dict[str, Any]:
        return {
            "attempt": self._registry.attempt,
            "step": step,
            "path": path,
            "size": size,
            "sha256": digest,
            "algorithm": "sha256",
            "metrics": metrics,
            "kind": kind,
        }

    def _commit(self, record: dict[str, Any]) -> dict[str, Any]:
        """Metrics and the server (one request), then the sidecar: only for a checkpoint that
        is fully on disk.

        A checkpoint becomes visible to a resume (its registration, or its sidecar record,
        which a restart finds) only once every metric point logged before it is durable: stored
        by the server before it registers it, or, while the server cannot take them, spooled
        and fsynced before the sidecar is written. A run resumed from it then never misses a
        step it logged before, whatever is killed when.
        """
        registry = self._registry
        if isinstance(registry, LocalRegistry):  # standalone: the spec's default retention
            self._write_sidecar(record)
            registry.retain(self.storage, [r for r in self._local_records() if r.get("_sidecar")])
            return registry.register(record)
        try:  # the metrics logged before it travel with it, stored first: one request
            registered = registry.register_with_metrics(record, retry_for=REGISTER_WAIT)
        except ClientError as exc:
            if registry.persist_metrics():  # spooled: durable without the server
                self._write_sidecar(record)
            else:
                log.error(
                    "trainhouse: checkpoint %s gets no record until the metrics logged before it "
                    "are sent: they can be neither sent nor spooled now (%s)",
                    record["path"],
                    exc,
                )
            self._register_later(record, exc)
            return record
        self._write_sidecar(record)  # for a restart that cannot ask the server
        return registered

    def _register_later(self, record: dict[str, Any], exc: ClientError) -> None:
        """The server could not register ``record`` now: the metric thread does it once the
        server answers, after the metrics logged before it (or it cannot be registered)."""
        retryable = isinstance(exc, ServerUnreachable) or exc.status >= 500
        if retryable and self._registry.defer(record):
            # training goes on; it is registered once the server is back
            log.warning(
                "trainhouse: checkpoint %s is written; it is registered once the "
                "server answers again (%s)",
                record["path"],
                exc,
            )
        else:
            log.error(
                "trainhouse: checkpoint %s written but not registered: %s", record["path"], exc
            )

    def _write_sidecar(self, record: dict[str, Any]) -> None:
        try:
            self.storage.write_text(sidecar_name(record["path"]), json.dumps(record))
        except OSError as exc:
            log.error("trainhouse: checkpoint %s kept without its record: %s", record["path"], exc)

    # -- sharded ---------------------------------------------------------------------------
    def _save_sharded(
        self,
        state: dict[str, Any],
        step: int,
        metrics: dict[str, float | None],
        rng_states: list[Any] | None,
        blocking: bool,
        comm: Comm,
    ) -> dict[str, Any] | SaveHandle | None:
        main = self._dist.is_main
        tmp = comm.broadcast(self.storage.temp_name(dir_name(step)) if main else None)
        if blocking:
            return self._write_sharded(state, step, metrics, rng_states, tmp, comm, comm.group)
        group = self._background_group() if comm.active else None
        error: BaseException | None = None
        staged: dict[str, Any] = {}
        try:
            staged = self._stage(state)
        except BaseException as exc:
            error = exc
        message = comm.agree(message_of(error))
        if error is not None:
            raise error
        if message is not None:
            raise CheckpointError(message)
        background = Comm(self._dist, group)
        handle = SaveHandle(
            step,
            lambda: self._write_sharded(staged, step, metrics, rng_states, tmp, background, group),
        )
        self._pending = handle
        self._outstanding = True
        handle._release()
        return handle

    def _background_group(self) -> Any:
        """A gloo group of all ranks for the collectives of background saves (collective)."""
        if self._bg_group is None:
            self._bg_group = gloo_group()
        return self._bg_group

    def _write_sharded(
        self,
        state: dict[str, Any],
        step: int,
        metrics: dict[str, float | None],
        rng_states: list[Any] | None,
        tmp: str,
        comm: Comm,
        group: Any,
    ) -> dict[str, Any] | None:
        storage = self.storage
        name = dir_name(step)
        needed = estimate_bytes(state)
        local: tuple[str, bool] | None = None
        try:
            shards.save_shards(state, storage, tmp, group)
        except BaseException as exc:
            full = is_disk_full(exc, free=storage.free_bytes(), needed=needed)
            local = (message_of(exc) or "", full)
        outcomes = comm.all_gather(local)  # every shard is written (or failed) past this point
        failed = [(r, o) for r, o in enumerate(outcomes) if o is not None]  # every rank knows
        total = needed * comm.world_size
        main = self._dist.is_main
        problem: BaseException | None = None
        entries: EntryList = []
        if not failed:
            # the main rank adds the RNG states and lists the files; every rank hashes its share
            listing: list[tuple[str, int]] | None = None
            if main:
                try:
                    if rng_states is not None:
                        shards.write_rng(storage, tmp, rng_states)
                    listing = storage.files(tmp)
                except BaseException as exc:
                    problem = exc
            listing = comm.broadcast(listing)
            if listing is not None:
                entries = [
                    e
                    for part in comm.all_gather(self._hash_share(tmp, listing, comm))
                    for e in part
                ]
        record: dict[str, Any] | None = None
        final: str | None = None
        if main:
            try:
                if failed:
                    if any(o[1] for _, o in failed):
                        raise OSError(28, "No space left on device")
                    rank, (msg, _) = failed[0]
                    raise CheckpointError(f"rank {rank} could not write its shard: {msg}")
                if problem is not None:
                    raise problem
                size = sum(entry[2] for entry in entries)
                digest = tree_digest(entries)
                storage.publish(tmp, name)
            except BaseException as exc:
                final = message_of(self._failed(exc, tmp, name, total))
            else:
                record = self._commit(self._record(step, name, size, digest, metrics, "sharded"))
        else:
            self._flush_other_rank()
        final = comm.broadcast(final)
        if final is not None:
            raise CheckpointError(final)
        return record

    # -- waiting ---------------------------------------------------------------------------
    def _take_failure(self) -> str | None:
        """Wait for this rank's pending background save; its failure message, once."""
        handle, self._pending = self._pending, None
        if handle is None:
            return None
        handle._join()
        return handle.failure()

    def _raise_first(self, failures: list[str | None], comm: Comm) -> None:
        for rank, message in enumerate(failures):
            if message is not None:
                prefix = "" if rank == comm.rank or not comm.active else f"rank {rank}: "
                raise CheckpointError(prefix + message)

    def wait(self) -> dict[str, Any] | None:
        """Wait for the pending background save; raise its failure on every rank (collective).

        Returns the record of the save waited for on the main rank, else None.
        """
        handle = self._pending
        self._settle(self._comm())
        return handle.record if handle is not None else None

    def _settle(self, comm: Comm) -> None:
        """Wait for the pending background save; raise its failure on every rank."""
        if self._outstanding:
            self._outstanding = False
            self._raise_first(comm.all_gather(self._take_failure()), comm)
        else:
            failure = self._take_failure()
            if failure is not None:
                raise CheckpointError(failure)

    def pending(self) -> SaveHandle | None:
        """The background save in progress or not yet waited for, if any."""
        return self._pending

    def _close(self, *, collective: bool) -> CheckpointError | None:
        """At the run's end: wait for the pending save; its failure (agreed among ranks)."""
        failure = self._take_failure()
        if collective and self._outstanding:
            self._outstanding = False
            comm = self._comm()
            try:
                failures = comm.all_gather(failure)
            except RuntimeError as exc:  # a rank is gone: report our own outcome only
                log.warning("trainhouse: cannot agree on the last checkpoint: %s", exc)
                failures = [failure]
            failure = next((f for f in failures if f is not None), None)
        for group in (self._bg_group, self._wait_group):
            if group is not None:
                import torch.distributed as dist

                with contextlib.suppress(Exception):
                    dist.destroy_process_group(group)
        self._bg_group = self._wait_group = None
        self._stage.clear()
        return CheckpointError(failure) if failure is not None else None

    def load(
        self, state: dict[str, Any] | None = None, *, restore_rng: bool = True
    ) -> dict[str, Any] | None:
        """The latest verified checkpoint's state on every rank, or None on a fresh start.

        Collective. A plain checkpoint is returned as a new dict (``state`` is not needed). A
        sharded one is loaded in place into ``state``, a template with the structure that was
        saved (e.g. ``{"model": model.state_dict(), "optim": ...}``), which is returned.
        ``restore_rng=True`` restores every rank's RNG states saved with the checkpoint.
        """
        comm = self._comm()
        self._settle(comm)
        chosen = self._find(comm)
        # the run goes on from here: steps logged after it by earlier attempts are dropped
        self._registry.resume_from(chosen)
        if chosen is None or chosen.get("kind") == "sharded":
            self._read = None  # the bytes _find kept are only for a file checkpoint
        if chosen is None:
            return None
        path = chosen["path"]
        where = self.storage.location(path)
        if chosen.get("kind") == "sharded":
            loaded = self._load_sharded(state, path, where, comm.group)
            states = shards.read_rng(self.storage, path) if restore_rng else None
        else:
            loaded = self._load_file(path, where)
            states = (loaded.pop(RESERVED, None) or {}).get("rng")
        if restore_rng and states is not None:
            rng_mod.restore_rank(states, self._dist.rank, self._dist.world_size)
        log.info("trainhouse: resumed from %s (step %s)", path, chosen["step"])
        return loaded

    def _load_file(self, path: str, where: str) -> dict[str, Any]:
        read, self._read = self._read, None
        try:
            local = self.storage.local_path(path)
            if read is not None and read[0] == path:  # verified in memory by _find
                state = file_format.parse(read[1])
            elif local is not None:
                state = safe_load(local)
            else:
                state = safe_load(io.BytesIO(self.storage.read_bytes(path)))
        except Exception as exc:
            raise CheckpointError(
                f"cannot load checkpoint {where}: {str(exc)[-300:]} (only tensors, numpy arrays, "
                "numbers, strings and containers of them can be loaded; save state_dict()s, "
                "not modules)"
            ) from None
        if not isinstance(state, dict):
            raise CheckpointError(f"checkpoint {where} holds a {type(state).__name__}, not a dict")
        return state

    def _load_sharded(
        self, state: dict[str, Any] | None, path: str, where: str, group: Any
    ) -> dict[str, Any]:
        if state is None:
            raise CheckpointError(
                f"checkpoint {where} is sharded (torch.distributed.checkpoint): pass the state "
                "to load into, with the structure it was saved with, e.g. "
                "run.checkpoint.load({'model': model.state_dict(), 'optim': optim.state_dict()}); "
                "it is filled in place and returned"
            )
        try:
            shards.load_shards(state, self.storage, path, group)
        except CheckpointError:
            raise
        except BaseException as exc:
            raise CheckpointError(f"cannot load sharded checkpoint {where}: {exc}") from exc
        return state
