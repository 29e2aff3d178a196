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
  still applies to its own ``output_dir``. Each node has an ``output_dir`` of its own: the
  ``rng_state_<rank>.pth`` of a rank on another node is sent to the main rank first
  (:func:`_gather_rng_states`), so the copy holds every rank's.
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
  that earlier attempts logged after the checkpoint. Every rank reads the checkpoint: each node
  gets a copy of its own (:meth:`~trainhouse.integrations._common.JobLink.resume_point`).

``report_to`` is left alone (transformers 5 defaults it to ``"none"``): the callback is
passed explicitly. Standalone (no ``TRAINHOUSE_JOB_ID``) metrics print on the console and
checkpoints are copied to ``./checkpoints``, as with the SDK.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

import transformers
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from trainhouse.integrations._common import JobLink, numbers
from trainhouse.sdk import Run

log = logging.getLogger("trainhouse")

__all__ = ["TrainhouseCallback"]

#: the largest RNG state file of a rank on another node copied into the job's checkpoint
_MAX_RNG_FILE = 1 << 20


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
        step = int(state.global_step)
        source = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        # every rank wrote its part (its RNG state) before the main rank copies the directory;
        # the parts written on other nodes (each has an output_dir of its own) reach it first
        run._dist.barrier()
        _gather_rng_states(run, source, int(args.process_index))
        if run.is_main:
            if source.is_dir():
                self.link.adopt(source, step=step, metrics=self._last)
            else:
                log.error("trainhouse: the Trainer saved no %s: nothing registered", source)
        run._dist.barrier()


def _gather_rng_states(run: Run, checkpoint: Path, process_index: int) -> None:
    """Collective: the ``rng_state_<i>.pth`` that each rank of a distributed Trainer writes
    into its own ``checkpoint`` directory, written into the main rank's where it lacks them.
    Ranks on the main rank's node share its ``output_dir`` and send nothing; a rank on another
    node sends its file (at most :data:`_MAX_RNG_FILE` bytes), so the job's copy holds every
    rank's RNG state, as the Trainer reads it back on a resume (each rank its own file)."""
    dist = run._dist
    if not dist.active or dist.world_size <= 1:
        return
    mine: bytes | None = None
    if dist.rank - dist.local_rank != 0:  # torchrun: the ranks of node 0 are 0 .. n-1
        path = checkpoint / f"rng_state_{process_index}.pth"
        try:
            with path.open("rb") as fh:
                mine = fh.read(_MAX_RNG_FILE + 1)
        except OSError:
            mine = None  # save_only_model, or a Trainer that saves no RNG state
        if mine is not None and len(mine) > _MAX_RNG_FILE:
            log.warning("trainhouse: %s is over %s bytes: not copied", path, _MAX_RNG_FILE)
            mine = None
    parts = dist.all_gather((process_index, mine))
    if not run.is_main or not checkpoint.is_dir():
        return
    for index, data in parts:
        if not isinstance(index, int) or not 0 < index < dist.world_size:
            continue
        if not isinstance(data, bytes):
            continue
        target = checkpoint / f"rng_state_{index}.pth"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            fd = os.open(target, flags, 0o644)
        except FileExistsError:
            continue  # written there (a shared output_dir)
        with os.fdopen(fd, "wb") as out:
            out.write(data)


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
