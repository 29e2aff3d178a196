"""What both integrations share: the run they report to, the hparams they record, the metric
values they keep, and the checkpoints they copy into the job and resume from."""

from __future__ import annotations

import enum
import logging
import math
import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainhouse.core.errors import CheckpointError
from trainhouse.sdk import Run, init
from trainhouse.sdk.checkpoint._adopt import adopt, commit_record, fetch, resume_choice

log = logging.getLogger("trainhouse")

#: how deep nested hparams are flattened ("optim.betas.0"); deeper values are left out
MAX_DEPTH = 4
#: the longest string value kept as an hparam
MAX_TEXT = 500

Scalar = bool | int | float | str


def flat_hparams(params: Mapping[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Scalar]:
    """``params`` as ``{"a.b": scalar}``: nested mappings, lists and tuples flattened with dots,
    enums and paths as strings; None, callables and other objects left out."""
    out: dict[str, Scalar] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, enum.Enum):
            value = value.value
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, bool | int | float | str):
            out[name] = value[:MAX_TEXT] if isinstance(value, str) else value
        elif isinstance(value, Mapping) and depth < MAX_DEPTH:
            out.update(flat_hparams(value, f"{name}.", depth + 1))
        elif isinstance(value, list | tuple) and depth < MAX_DEPTH:
            out.update(
                flat_hparams({str(i): v for i, v in enumerate(value)}, f"{name}.", depth + 1)
            )
    return out


def numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of ``values`` (numbers, numpy scalars, one-element tensors) as
    floats; strings and other objects are left out (a Trainer logs none, Lightning may)."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if hasattr(value, "numel") and callable(value.numel):
            if value.numel() != 1:
                continue
            value = value.detach().item() if hasattr(value, "detach") else value.item()
        elif hasattr(value, "item") and callable(value.item) and hasattr(value, "dtype"):
            if getattr(value, "size", 1) != 1:  # a numpy array of several values
                continue
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[str(key)] = float(value)
    return out


def finite(values: Mapping[str, float]) -> dict[str, float | None]:
    """Values as a checkpoint record keeps them (None for NaN and infinities)."""
    return {k: (v if math.isfinite(v) else None) for k, v in values.items()}


class JobLink:
    """An integration's hold on the job: the :class:`~trainhouse.sdk.Run` (the one given, or one
    started at first use with ``trainhouse.init()``), the checkpoints it copied into the job, and
    where the one to resume from is."""

    def __init__(self, run: Run | None) -> None:
        self._run = run
        self.adopted: set[int] = set()
        self.resumed: Path | None = None
        self.pending: dict[str, Any] | None = None  # copied, not committed yet
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = init()
        return self._run

    def record_hparams(self, params: Mapping[str, Any]) -> dict[str, Scalar]:
        """Add ``params`` (flattened) to ``run.hparams`` and report them to the server as
        hparams the run uses (``run.set_hparams``: the runs table, ``show``, compare); the job
        spec's own hparams win."""
        run = self.run
        flat = flat_hparams(params)
        added = {key: value for key, value in flat.items() if key not in run.hparams}
        if added:
            run.set_hparams(added)
        return flat

    def adopt(
        self,
        source: str | os.PathLike[str],
        *,
        step: int,
        metrics: Mapping[str, float],
        commit: bool = True,
    ) -> dict[str, Any] | None:
        """Copy the checkpoint ``source`` into the job as the checkpoint of ``step`` and register
        it (main rank only; once per step: Lightning may write a step's checkpoint twice, as
        ``epoch=..-step=...ckpt`` and ``last.ckpt``). ``commit=False``: registered by the next
        :meth:`commit`, once the metrics of the steps it holds are logged."""
        if not self.run.is_main or step in self.adopted:
            return None
        self.commit()
        record = adopt(
            self.run.checkpoint, source, step=step, metrics=finite(metrics), commit=commit
        )
        self.adopted.add(step)
        if not commit:
            self.pending = record
        return record

    def commit(self) -> None:
        """Register the checkpoint copied with ``commit=False``, if any, after the metrics
        logged so far."""
        record, self.pending = self.pending, None
        if record is not None:
            commit_record(self.run.checkpoint, record)

    def resume_point(self) -> Path | None:
        """The job's newest verified checkpoint to resume from, as a path on this node, or None
        (a fresh start). Collective: every rank calls it. The main rank picks the checkpoint
        and tells the other ranks which; the first rank of each node (``LOCAL_RANK`` 0) makes it
        a local path (a download into its own temp directory where the storage is remote) and
        the node's other ranks use that copy: a rank never gets a path on another node's disk.
        A failure on any rank raises CheckpointError on every rank."""
        run = self.run
        dist = run._dist
        chosen: dict[str, Any] | None = None
        if run.is_main:
            try:
                chosen = resume_choice(run.checkpoint)
            except Exception as exc:  # the other ranks wait in the broadcast: tell them
                chosen = {"error": f"cannot find the checkpoint to resume from: {exc!r}"}
        chosen = dist.broadcast(chosen)
        if chosen is not None and "error" in chosen:
            raise CheckpointError(str(chosen["error"]))
        if chosen is None:
            self.resumed = None
            return None
        # torchrun numbers a node's ranks consecutively: its first rank is rank - local_rank;
        # the node each copy is on goes with it, and a rank not laid out so fetches its own
        node = (socket.gethostname(), os.environ.get("GROUP_RANK"))
        mine: tuple[str | None, str | None, tuple[str, str | None]] = (None, None, node)
        if dist.local_rank == 0:
            mine = (*self._fetch(chosen), node)
        everyone = dist.all_gather(mine)
        failed = [f"rank {r}: {err}" for r, (_, err, _) in enumerate(everyone) if err is not None]
        if failed:
            raise CheckpointError(
                "cannot fetch the checkpoint to resume from: " + "; ".join(failed)
            )
        first = dist.rank - dist.local_rank
        local = None
        if 0 <= first < len(everyone) and tuple(everyone[first][2]) == node:
            local = everyone[first][0]
        if local is None:
            local, err = self._fetch(chosen)
            if err is not None or local is None:
                raise CheckpointError(f"cannot fetch the checkpoint to resume from: {err}")
        log.info("trainhouse: resuming from %s (step %s)", local, chosen["step"])
        self.resumed = Path(local)
        return self.resumed

    def _fetch(self, chosen: dict[str, Any]) -> tuple[str | None, str | None]:
        """(the local path of ``chosen``, None) or (None, why not)."""
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="trainhouse-resume-")
        try:
            return str(fetch(self.run.checkpoint, chosen, self._scratch.name)), None
        except Exception as exc:
            return None, repr(exc)
