"""What both integrations share: the run they report to, the hparams they record, the metric
values they keep, and the checkpoints they copy into the job and resume from."""

from __future__ import annotations

import enum
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainhouse.sdk import Run, init
from trainhouse.sdk.checkpoint._adopt import adopt, commit_record, resume_point

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
        """The job's newest verified checkpoint to resume from, as a local path, or None (a
        fresh start, or not rank 0: only the main rank looks; the others get the same path
        from it, through the run's collectives). Asked once per process."""
        run = self.run
        local: Path | None = None
        if run.is_main:
            if self._scratch is None:
                self._scratch = tempfile.TemporaryDirectory(prefix="trainhouse-resume-")
            local = resume_point(run.checkpoint, self._scratch.name)
        shared = run._dist.broadcast(str(local) if local is not None else None)
        self.resumed = Path(shared) if shared is not None else None
        return self.resumed
