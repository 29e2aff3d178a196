"""Checkpoints: atomic writes, checksums registered with the server, safe loads.

``save`` and ``load`` are collective: every rank calls them. The main rank writes the (replicated)
state with write/fsync/rename and registers step, size and sha256; ``load`` verifies the checksum
and never unpickles arbitrary objects (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainhouse.durable import publish, sha256_file
from trainhouse.errors import CheckpointError, ClientError

if TYPE_CHECKING:
    from trainhouse.sdk.run import Run

log = logging.getLogger("trainhouse")


def _numpy_safe_globals() -> list[Any]:
    """What unpickling plain numpy arrays and scalars needs (no object arrays, no code)."""
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    return [
        np.ndarray,
        np.dtype,
        core.multiarray._reconstruct,
        core.multiarray.scalar,
        *(type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDGUS"),
    ]


def _global_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def load_checkpoint(path: str | Path) -> Any:
    """Load a checkpoint file written by ``run.checkpoint.save``, outside a run too.

    ``torch.load(weights_only=True)`` that also accepts plain numpy arrays and scalars (RNG
    states); it never unpickles arbitrary objects.
    """
    import torch

    with torch.serialization.safe_globals(_numpy_safe_globals()):
        return torch.load(Path(path), map_location="cpu", weights_only=True)


safe_load = load_checkpoint


def refuse_unloadable(path: Path) -> None:
    """Raise if ``load_checkpoint`` could not read ``path`` back (checked before it is kept)."""
    import torch

    allowed = {_global_name(g) for g in _numpy_safe_globals()}
    unsafe = [
        g for g in torch.serialization.get_unsafe_globals_in_checkpoint(path) if g not in allowed
    ]
    if unsafe:
        raise CheckpointError(
            f"the state holds objects a checkpoint cannot load safely: {', '.join(unsafe)}; "
            "save tensors, numpy arrays, numbers, strings and containers of them "
            "(state_dict()s, not modules or custom classes)"
        )


_FILE = re.compile(r"^step-(\d+)\.pt$")


def file_name(step: int) -> str:
    return f"step-{step:09d}.pt"


class Checkpointer:
    """``run.checkpoint``: save and load the training state."""

    def __init__(self, run: Run, directory: Path) -> None:
        self._run = run
        self.directory = directory

    # -- save ------------------------------------------------------------------------------
    def save(
        self, state: dict[str, Any], *, step: int, metrics: dict[str, float] | None = None
    ) -> dict[str, Any] | None:
        """Write ``state`` as the checkpoint of ``step`` (collective; the main rank writes).

        Returns the checkpoint's record on the main rank, None on the others.
        """
        run = self._run
        record = None
        error: BaseException | None = None
        if run.is_main:
            try:
                record = self._write(state, step, metrics or {})
            except BaseException as exc:  # keep the ranks in step, then raise below
                error = exc
        else:
            with contextlib.suppress(ClientError):
                run._flush_metrics()  # values other ranks logged with all_ranks=True
        run._barrier()
        if error is not None:
            raise error
        return record

    def _write(self, state: dict[str, Any], step: int, metrics: dict[str, float]) -> dict[str, Any]:
        import torch

        if step < 0:
            raise CheckpointError(f"checkpoint step must be >= 0, got {step}")
        self.directory.mkdir(parents=True, exist_ok=True)
        name = file_name(step)
        final = self.directory / name
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        try:
            torch.save(state, tmp)
            refuse_unloadable(tmp)
            digest = sha256_file(tmp)
            size = tmp.stat().st_size
            publish(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        clean = {k: float(v) for k, v in metrics.items()}
        record: dict[str, Any] = {
            "attempt": self._run.attempt,
            "step": step,
            "path": name,
            "size": size,
            "sha256": digest,
            "metrics": {
                k: (v if v == v and abs(v) != float("inf") else None) for k, v in clean.items()
            },
        }
        sidecar = self.directory / f"{name}.json"
        sidecar_tmp = sidecar.with_suffix(".json.tmp")
        sidecar_tmp.write_text(json.dumps(record))
        os.replace(sidecar_tmp, sidecar)
        if self._run._api is not None:
            try:
                # every metric up to this step is stored before the server knows the checkpoint:
                # a run resumed from it never misses a step it logged before
                self._run._flush_metrics()
                return self._run._api.register_checkpoint(record)
            except ClientError as exc:
                log.error("trainhouse: checkpoint %s written but not registered: %s", name, exc)
        return record

    # -- load ------------------------------------------------------------------------------
    def _candidates(self) -> list[dict[str, Any]]:
        """Known checkpoints, newest first."""
        api = self._run._api
        if api is not None:
            try:
                found = api.checkpoints()
                return sorted(found, key=lambda c: (c["step"], c["id"]), reverse=True)
            except ClientError as exc:
                log.warning(
                    "trainhouse: cannot list checkpoints (%s); reading %s", exc, self.directory
                )
        local: list[dict[str, Any]] = []
        if self.directory.is_dir():
            for path in self.directory.glob("step-*.pt"):
                match = _FILE.match(path.name)
                if match is None:
                    continue
                record: dict[str, Any] = {
                    "step": int(match.group(1)),
                    "path": path.name,
                    "sha256": None,
                }
                with contextlib.suppress(OSError, ValueError):
                    record = json.loads(path.with_name(path.name + ".json").read_text())
                local.append(record)
        return sorted(local, key=lambda c: c["step"], reverse=True)

    def latest(self) -> dict[str, Any] | None:
        """The newest checkpoint whose file exists and whose sha256 matches, or None."""
        for cand in self._candidates():
            path = self.directory / cand["path"]
            if not path.is_file():
                log.warning("trainhouse: checkpoint %s is missing; trying an older one", path)
                continue
            if cand.get("sha256") is None:  # copied in by hand, without its record
                log.warning(
                    "trainhouse: checkpoint %s has no recorded sha256; loading it unverified", path
                )
                return cand
            actual = sha256_file(path)
            if actual != cand["sha256"]:
                log.error(
                    "trainhouse: checkpoint %s is corrupt (sha256 %s, expected %s); "
                    "trying an older one",
                    path,
                    actual[:12],
                    cand["sha256"][:12],
                )
                continue
            return cand
        return None

    def load(self) -> dict[str, Any] | None:
        """The latest verified checkpoint's state on every rank, or None on a fresh start."""
        run = self._run
        chosen: dict[str, Any] | None = None
        if run.is_main:
            try:
                chosen = self.latest()
            except Exception as exc:  # tell the other ranks, which wait in the broadcast
                chosen = {"error": f"cannot find the latest checkpoint: {exc}"}
        chosen = run._broadcast(chosen)
        if chosen is not None and "error" in chosen:
            raise CheckpointError(chosen["error"])
        if run._reporter is not None and run.attempt > 1:
            # the run goes on from here: steps logged after it by earlier attempts are dropped
            run._reporter.resume_step = int(chosen["step"]) if chosen else -1
        if chosen is None:
            return None
        path = self.directory / chosen["path"]
        try:
            state: dict[str, Any] = safe_load(path)
        except Exception as exc:
            raise CheckpointError(
                f"cannot load checkpoint {path}: {str(exc)[-300:]} (only tensors, numpy arrays, "
                "numbers, strings and containers of them can be loaded; save state_dict()s, "
                "not modules)"
            ) from None
        log.info("trainhouse: resumed from %s (step %s)", path.name, chosen["step"])
        return state
