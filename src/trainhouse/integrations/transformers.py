"""The Hugging Face ``Trainer`` as a trainhouse job: add one callback.

::

    from trainhouse.integrations.transformers import TrainhouseCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TrainhouseCallback()])
    trainer.train()

:class:`TrainhouseCallback` starts the run (``trainhouse.init()``, or takes the ``run`` given)
and then:

- **metrics**: every ``on_log`` goes to ``run.log`` at the Trainer's ``global_step``, names as
  the Trainer spells them (``loss``, ``grad_norm``, ``learning_rate``, ``eval_loss``, ...); a
  step logged again replaces its value, so a resumed run stores each step once.
- **hparams**: the ``TrainingArguments`` (flattened, scalars only) are added to
  ``run.hparams``; the job spec's own hparams win.
- **checkpoints**: each ``checkpoint-N/`` directory the Trainer saves is copied into the job's
  checkpoint storage as ``step-00000000N/``, hashed (sha256 over its files), published
  atomically and registered with the server, after the metrics logged before it. Retention
  (the spec's ``checkpoints:``) applies to these copies; the Trainer's ``save_total_limit``
  still applies to its own ``output_dir``.
- **preemption**: ``run.should_stop()`` is asked at every step's end (every rank, as the
  collective requires); once true the callback sets ``control.should_save`` and
  ``control.should_training_stop``: the Trainer saves, the copy is registered, ``train()``
  returns, and the script ends normally.
- **resume**: on a restart, ``trainer.train()`` called without ``resume_from_checkpoint``
  resumes from the job's newest checkpoint whose sha256 matches. The Trainer reads
  ``resume_from_checkpoint`` before any callback runs, so importing this module wraps
  ``transformers.Trainer.train`` once: the wrapper acts only for a trainer that carries a
  ``TrainhouseCallback`` (with ``resume=True``) and was given no ``resume_from_checkpoint``
  (an explicit path, ``True`` or ``False`` is left as it is). The server then drops the steps
  that earlier attempts logged after the checkpoint.

``report_to`` is left alone (transformers 5 defaults it to ``"none"``): the callback is
passed explicitly. Standalone (no ``TRAINHOUSE_JOB_ID``) metrics print on the console and
checkpoints are copied to ``./checkpoints``, as with the SDK.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import transformers
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from trainhouse.integrations._common import JobLink, numbers
from trainhouse.sdk import Run

log = logging.getLogger("trainhouse")

__all__ = ["TrainhouseCallback"]


class TrainhouseCallback(TrainerCallback):
    """Reports a ``Trainer`` to its trainhouse job (see the module's docstring).

    ``run``: the run to report to (default: ``trainhouse.init()`` when the Trainer is made).
    ``resume=False`` leaves ``trainer.train()`` alone on a restart. ``checkpoints=False`` does
    not copy the Trainer's checkpoints into the job (nothing to resume from then).
    """

    def __init__(
        self, run: Run | None = None, *, resume: bool = True, checkpoints: bool = True
    ) -> None:
        self.link = JobLink(run)
        self.resume = resume
        self.checkpoints = checkpoints
        self._last: dict[str, float] = {}  # the latest logged values, kept with a checkpoint

    @property
    def run(self) -> Run:
        """The run this callback reports to (started at first use)."""
        return self.link.run

    def resume_point(self) -> Path | None:
        """The job's newest verified checkpoint directory (collective over the run's ranks)."""
        return self.link.resume_point() if self.checkpoints else None

    # -- the Trainer's events --------------------------------------------------------------
    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.link.record_hparams(args.to_dict())  # type: ignore[no-untyped-call]

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.max_steps and state.max_steps > 0:
            self.run.set_total_steps(int(state.max_steps))

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        values = numbers(logs or {})
        if values:
            self._last.update(values)
            self.run.log(values, step=int(state.global_step))

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.run.should_stop():
            log.warning(
                "trainhouse: the server asks this job to stop: saving step %s and stopping",
                state.global_step,
            )
            control.should_save = self.checkpoints
            control.should_training_stop = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if not self.checkpoints:
            return
        run = self.run
        # every rank wrote its part (its RNG state) before the main rank copies the directory
        run._dist.barrier()
        if run.is_main:
            step = int(state.global_step)
            source = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
            if source.is_dir():
                self.link.adopt(source, step=step, metrics=self._last)
            else:
                log.error("trainhouse: the Trainer saved no %s: nothing registered", source)
        run._dist.barrier()


def _callback_of(trainer: Any) -> TrainhouseCallback | None:
    handler = getattr(trainer, "callback_handler", None)
    for cb in getattr(handler, "callbacks", ()):
        if isinstance(cb, TrainhouseCallback):
            return cb
    return None


def _wrap_train(train: Any) -> Any:
    """``Trainer.train`` that, for a trainer with a :class:`TrainhouseCallback` and no
    ``resume_from_checkpoint`` given, resumes from the job's newest verified checkpoint."""
    if getattr(train, "__trainhouse__", False):
        return train

    @functools.wraps(train)
    def wrapped(self: Any, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        callback = _callback_of(self)
        if callback is not None and callback.resume and resume_from_checkpoint is None:
            found = callback.resume_point()
            if found is not None:
                log.warning("trainhouse: resuming the Trainer from %s", found)
                resume_from_checkpoint = str(found)
        return train(self, resume_from_checkpoint, *args, **kwargs)

    wrapped.__trainhouse__ = True  # type: ignore[attr-defined]
    return wrapped


transformers.Trainer.train = _wrap_train(transformers.Trainer.train)  # type: ignore[method-assign]
