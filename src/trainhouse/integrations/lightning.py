"""PyTorch Lightning as a trainhouse job: a logger and a callback.

::

    from trainhouse.integrations.lightning import TrainhouseCallback, TrainhouseLogger

    trainer = L.Trainer(max_steps=100, logger=TrainhouseLogger(), callbacks=[TrainhouseCallback()])
    trainer.fit(model, data)

:class:`TrainhouseLogger` sends what ``self.log(...)`` records to ``run.log`` at Lightning's
step, and ``save_hyperparameters()`` (``log_hyperparams``) to ``run.hparams`` (the job spec's
own hparams win).

:class:`TrainhouseCallback` carries the rest:

- **checkpoints**: it wraps the strategy's ``CheckpointIO`` (in ``setup``), so every
  checkpoint Lightning writes (``ModelCheckpoint``, ``trainer.save_checkpoint``) is, once
  written, copied into the job's checkpoint storage as ``step-00000000N.pt`` (N: the
  checkpoint's ``global_step``), hashed (sha256) and published atomically. Lightning writes a
  mid-training checkpoint in ``on_train_batch_end``, before it logs that batch's metrics (at
  step N - 1): the copy is registered with the server once they are logged (at the next
  batch's start, or training's end), after them, so a run resumed from it misses no step. A
  step written twice (``last.ckpt`` beside ``epoch=..-step=N.ckpt``) is copied once.
- **preemption**: ``run.should_stop()`` is asked after every training batch (every rank); once
  true, the callback saves a checkpoint (``trainer.save_checkpoint``, under
  ``default_root_dir/trainhouse/``), which is registered, and sets ``trainer.should_stop``:
  ``fit`` returns and the script ends normally.
- **resume**: on a restart, ``trainer.fit(...)`` called without ``ckpt_path`` (and with no
  ``trainer.ckpt_path`` set) resumes from the job's newest checkpoint whose sha256 matches.
  Lightning picks the checkpoint before any callback runs, so importing this module wraps
  ``lightning.pytorch.Trainer.fit`` once: the wrapper acts only for a trainer that carries a
  ``TrainhouseCallback`` (with ``resume=True``). The server then drops the steps that earlier
  attempts logged after the checkpoint. Every rank loads ``ckpt_path``: each node gets a copy
  of its own (:meth:`~trainhouse.integrations._common.JobLink.resume_point`).

Both work with ``import lightning.pytorch as L`` (the ``lightning`` package).
"""

from __future__ import annotations

import functools
import logging
import math
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from trainhouse.integrations._common import JobLink, numbers
from trainhouse.sdk import Run

log = logging.getLogger("trainhouse")

__all__ = ["TrainhouseCallback", "TrainhouseLogger"]


class TrainhouseLogger(Logger):
    """Lightning's metrics and hyperparameters to the job (see the module's docstring).

    ``run``: the run to report to (default: ``trainhouse.init()`` at first use).
    """

    def __init__(self, run: Run | None = None) -> None:
        super().__init__()
        self.link = JobLink(run)

    @property
    def run(self) -> Run:
        return self.link.run

    @property
    def name(self) -> str:
        return "trainhouse"

    @property
    def version(self) -> str:
        run = self.run
        return f"job-{run.job_id}" if run.job_id is not None else "standalone"

    @property
    def experiment(self) -> Run:
        """The :class:`~trainhouse.sdk.Run` (``self.logger.experiment.log(...)`` works too)."""
        return self.run

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace, *args: Any, **kw: Any) -> None:
        values = vars(params) if isinstance(params, Namespace) else dict(params)
        self.link.record_hparams(values)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        values = numbers(metrics)
        if values:
            self.run.log(values, step=step)


class _AdoptingIO(CheckpointIO):
    """The strategy's own CheckpointIO, and each checkpoint it saves copied into the job."""

    def __init__(self, inner: CheckpointIO, callback: TrainhouseCallback) -> None:
        self.inner = inner
        self.callback = callback

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        step = int(checkpoint.get("global_step", 0))
        trainer = self.callback._trainer
        # in the middle of training, the metrics of the batch this checkpoint ends with are
        # logged after it is written: it is registered once they are (the next batch's start,
        # the end of training), so a resume from it never misses them
        later = trainer is not None and bool(trainer.training)
        self.callback.link.adopt(
            Path(path), step=step, metrics=self.callback.metrics(), commit=not later
        )

    def load_checkpoint(self, path: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        loaded: dict[str, Any] = self.inner.load_checkpoint(path, *args, **kw)
        return loaded

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


class TrainhouseCallback(Callback):
    """Checkpoints registered and resumed, and preemption (see the module's docstring).

    ``run``: the run to report to (default: ``trainhouse.init()`` at first use; a
    :class:`TrainhouseLogger` in the same trainer shares its run). ``resume=False`` leaves
    ``trainer.fit()`` alone on a restart; ``checkpoints=False`` copies nothing into the job.
    """

    def __init__(
        self, run: Run | None = None, *, resume: bool = True, checkpoints: bool = True
    ) -> None:
        self.link = JobLink(run)
        self.resume = resume
        self.checkpoints = checkpoints
        self._trainer: pl.Trainer | None = None

    @property
    def run(self) -> Run:
        return self.link.run

    def share_run(self, trainer: pl.Trainer) -> None:
        """Use the run of the trainer's TrainhouseLogger, where it has one and this callback
        was given none: one run per process."""
        if self.link._run is not None:
            return
        for logger in trainer.loggers:
            if isinstance(logger, TrainhouseLogger):
                self.link._run = logger.run
                return

    def metrics(self) -> dict[str, float]:
        """The trainer's latest logged values, kept in a checkpoint's record."""
        if self._trainer is None:
            return {}
        return numbers(self._trainer.callback_metrics)

    def resume_point(self) -> Path | None:
        """The job's newest verified checkpoint file (collective over the run's ranks)."""
        return self.link.resume_point() if self.checkpoints else None

    # -- Lightning's events ----------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        self.share_run(trainer)
        strategy = trainer.strategy
        if self.checkpoints and not isinstance(strategy.checkpoint_io, _AdoptingIO):
            strategy.checkpoint_io = _AdoptingIO(strategy.checkpoint_io, self)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        total = trainer.estimated_stepping_batches
        if isinstance(total, int | float) and math.isfinite(total) and total > 0:
            self.run.set_total_steps(int(total))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.link.commit()  # the previous batch's metrics are logged by now

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.link.commit()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.link.commit()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.link.commit()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if trainer.should_stop or not self.run.should_stop():
            return
        step = trainer.global_step
        log.warning("trainhouse: the server asks this job to stop: saving step %s", step)
        if self.checkpoints:
            target = Path(trainer.default_root_dir) / "trainhouse" / f"stop-step={step}.ckpt"
            trainer.save_checkpoint(target)
        trainer.should_stop = True


def _callback_of(trainer: Any) -> TrainhouseCallback | None:
    for cb in getattr(trainer, "callbacks", ()):
        if isinstance(cb, TrainhouseCallback):
            return cb
    return None


def _wrap_fit(fit: Any) -> Any:
    """``Trainer.fit`` that, for a trainer with a :class:`TrainhouseCallback` and no checkpoint
    asked for, resumes from the job's newest verified checkpoint."""
    if getattr(fit, "__trainhouse__", False):
        return fit

    @functools.wraps(fit)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        callback = _callback_of(self)
        # a path given to fit, or set with ``trainer.ckpt_path = ...`` (Lightning's "user managed")
        asked = (
            kwargs.get("ckpt_path") is not None
            or (len(args) >= 5 and args[4] is not None)
            or bool(getattr(self._checkpoint_connector, "_user_managed", False))
        )
        if callback is not None and callback.resume and not asked:
            callback.share_run(self)
            found = callback.resume_point()
            if found is not None:
                log.warning("trainhouse: resuming Lightning from %s", found)
                if len(args) >= 5:
                    args = (*args[:4], None, *args[5:])
                kwargs["ckpt_path"] = str(found)
        return fit(self, *args, **kwargs)

    wrapped.__trainhouse__ = True  # type: ignore[attr-defined]
    return wrapped


pl.Trainer.fit = _wrap_fit(pl.Trainer.fit)  # type: ignore[method-assign]
