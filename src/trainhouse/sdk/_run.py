"""``trainhouse.init()`` and the Run a training script talks to.

Under the server (``TRAINHOUSE_JOB_ID`` set by the executor) metrics go to the server and
checkpoints to the job's directory. Anywhere else (``python train.py`` or bare ``torchrun``) the
run is standalone: metrics print to the console and checkpoints go to ``./checkpoints`` (or to
``TRAINHOUSE_CHECKPOINT_URL``).

A Run is composed of parts chosen once, when it starts, each handed what it needs:

- a :class:`~trainhouse.sdk._distributed.DistributedContext`: rank, device and collectives;
- a :class:`~trainhouse.sdk._sinks.MetricsSink`: where ``log`` sends values;
- a :class:`~trainhouse.sdk._preempt.Preemption` over a stop signal: ``should_stop``;
- ``checkpoint``, a :class:`~trainhouse.sdk.checkpoint.Checkpointer` with a
  :class:`~trainhouse.sdk.checkpoint._registry.CheckpointRegistry`.

Under the server the sink, the stop signal and the registry share one
:class:`~trainhouse.sdk._server.ServerLink`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from trainhouse.core.datasets import ENV_PREFIX as DATASET_ENV_PREFIX
from trainhouse.core.defaults import DEFAULT_KEEP_LAST
from trainhouse.core.flows import INPUT_PREFIX
from trainhouse.jobfs.layout import CHECKPOINT_URL_ENV, JobEnv
from trainhouse.sdk._distributed import DistributedContext, connect
from trainhouse.sdk._media import Histogram, Image, MediaLogger, Table
from trainhouse.sdk._metrics import finite_or_none
from trainhouse.sdk._preempt import NeverStop, Preemption, ServerStop, StopSignal
from trainhouse.sdk._server import ServerLink
from trainhouse.sdk._sinks import ConsoleSink, MetricsSink, ServerSink
from trainhouse.sdk._transport import JobAPI
from trainhouse.sdk.checkpoint import Checkpointer
from trainhouse.sdk.checkpoint._registry import CheckpointRegistry, LocalRegistry, ServerRegistry

if TYPE_CHECKING:
    import torch

log = logging.getLogger("trainhouse")


def _number(name: object, value: Any) -> float:
    """A metric value as a float: numbers, numpy scalars and one-element tensors."""
    if hasattr(value, "item") and callable(value.item):
        value = value.detach().item() if hasattr(value, "detach") else value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"metric {name!r} must be a number, got {type(value).__name__} {value!r}"
            ) from None
    return float(value)


def _print_now(exc: BaseException) -> None:
    """Print ``exc``'s traceback to stderr now, and keep the interpreter from printing it again
    when it ends the process with it."""
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    previous = sys.excepthook

    def once(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if value is not exc:
            previous(kind, value, tb)

    sys.excepthook = once


class HparamsSender:
    """Sends the hparams a run uses to the server from a thread: the latest set wins, a failed
    send is retried for a minute, and the server's warnings (a spec key the script does not
    declare) are printed to the rank's log. Nothing here ever raises into training."""

    RETRY_FOR = 60.0
    CLOSE_WAIT = 5.0  # seconds the run's end waits for a send still pending

    def __init__(self, api: JobAPI, script_keys: list[str] | None) -> None:
        self.api = api
        self.script_keys = script_keys
        self._pending: dict[str, Any] | None = None
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="trainhouse-hparams", daemon=True)
        self._thread.start()

    def send(self, hparams: dict[str, Any]) -> None:
        with self._cond:
            self._pending = hparams
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                hparams, self._pending, self._busy = self._pending, None, True
            try:
                answer = self.api.report_hparams(
                    hparams, self.script_keys, retry_for=self.RETRY_FOR
                )
                for warning in answer.get("warnings") or []:
                    print(f"trainhouse: {warning}", file=sys.stderr, flush=True)
            except Exception as exc:  # the network, a value that is not JSON
                log.warning("trainhouse: the run's hparams were not recorded: %s", exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def close(self) -> None:
        """Wait a little for a send still pending; the thread then ends."""
        deadline = time.monotonic() + self.CLOSE_WAIT
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while (self._pending is not None or self._busy) and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))


class _Parts(NamedTuple):
    """What differs between a run under the server and a standalone one."""

    metrics: MetricsSink
    stop: StopSignal
    registry: CheckpointRegistry
    location: str | Path  # where checkpoints go: a directory or a URL (any fsspec one)
    api: JobAPI | None = None  # the job's API (None: standalone)


def _server_parts(job: JobEnv, distributed: DistributedContext) -> _Parts:
    layout = job.attempt_layout
    link = ServerLink(
        JobAPI(job.url, job.job_id, job.token),
        job.attempt,
        spool=layout.spool if layout is not None else None,
        report=distributed.is_main,
    )
    sink = ServerSink(link, rank=distributed.rank, is_main=distributed.is_main)
    return _Parts(sink, ServerStop(link), ServerRegistry(link), job.checkpoints, link.api)


#: a standalone run's checkpoint retention (the newest this many stay in ./checkpoints)
KEEP_LAST_ENV = "TRAINHOUSE_KEEP_LAST"


def _keep_last() -> int:
    """How many checkpoints a standalone run keeps: ``TRAINHOUSE_KEEP_LAST``, else the spec's
    default ``checkpoints.keep_last``."""
    raw = os.environ.get(KEEP_LAST_ENV, "").strip()
    if not raw:
        return DEFAULT_KEEP_LAST
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{KEEP_LAST_ENV} must be a whole number >= 1, got {raw!r}")
    return int(raw)


def _standalone_parts(distributed: DistributedContext) -> _Parts:
    # a URL given by hand (any fsspec one) replaces ./checkpoints
    location = os.environ.get(CHECKPOINT_URL_ENV) or Path("checkpoints").resolve()
    registry = LocalRegistry(
        location=str(location), is_main=distributed.is_main, keep_last=_keep_last()
    )
    return _Parts(ConsoleSink(is_main=distributed.is_main), NeverStop(), registry, location)


class Run:
    """One attempt of a training job as seen from one rank (see the module's docstring for the
    parts it is made of)."""

    def __init__(
        self,
        *,
        hparams: dict[str, Any] | None = None,
        total_steps: int | None = None,
        backend: str | None = None,
    ) -> None:
        job = JobEnv.from_env()
        self.job_id: int | None = job.job_id if job is not None else None
        self.attempt = job.attempt if job is not None else 1
        self.standalone = job is None
        self._attempt_layout = job.attempt_layout if job is not None else None
        self._job = job
        self.hparams: dict[str, Any] = dict(hparams or {})
        # the keys the script declares (its defaults): spec keys outside them are flagged
        self._script_keys = sorted(str(k) for k in self.hparams) if hparams else None
        if job is not None:
            self.hparams.update(job.hparams)
        self._step = -1
        self._closed = False
        started = time.monotonic()  # should_stop's first agreement counts calls from here
        self._dist = connect(backend)
        parts = _server_parts(job, self._dist) if job is not None else _standalone_parts(self._dist)
        self._metrics = parts.metrics
        self._preemption = Preemption(parts.stop, self._dist, since=started)
        self.checkpoint = Checkpointer(
            parts.location, distributed=self._dist, registry=parts.registry
        )
        self._hparams_sender = (
            HparamsSender(parts.api, self._script_keys)
            if parts.api is not None and self.is_main
            else None
        )
        self._media = MediaLogger(parts.api, is_main=self.is_main)
        if total_steps is not None:
            self.set_total_steps(total_steps)
        self._report_hparams()
        atexit.register(self._finish_at_exit)

    # -- where this rank stands ------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank among the run's processes (``RANK``; 0 alone)."""
        return self._dist.rank

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (``LOCAL_RANK``), which picks its GPU."""
        return self._dist.local_rank

    @property
    def world_size(self) -> int:
        """How many processes the run has (``WORLD_SIZE``; 1 alone)."""
        return self._dist.world_size

    @property
    def previous_world_size(self) -> int | None:
        """How many processes the job's previous attempt had (None on its first attempt or
        outside the server)."""
        return self._job.previous_world_size if self._job is not None else None

    @property
    def resized(self) -> bool:
        """Whether this attempt has another world size than the previous one: the scheduler
        resized an elastic job (a script may rescale its learning rate, say). Its data
        resumes where it stopped with :class:`trainhouse.sdk.data.ResumableSampler`."""
        previous = self.previous_world_size
        return previous is not None and previous != self.world_size

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, which speaks for the job."""
        return self._dist.is_main

    @property
    def device(self) -> torch.device:
        """This rank's device: its GPU where CUDA is usable, else the CPU."""
        return self._dist.device

    @property
    def datasets(self) -> dict[str, Path]:
        """The dataset versions the job pins, by key: each the path of a verified, read-only
        copy on this node (``TRAINHOUSE_DATASET_<KEY>``; ``datasets: {train: digits@2}`` gives
        ``run.datasets["train"]``). Outside trainhouse (bare torchrun) set those variables
        yourself, and the script runs unchanged."""
        return {
            name.removeprefix(DATASET_ENV_PREFIX).lower(): Path(value)
            for name, value in sorted(os.environ.items())
            if name.startswith(DATASET_ENV_PREFIX) and value
        }

    @property
    def inputs(self) -> dict[str, Path]:
        """The models the job reads (``inputs: {candidate: job:31}``, or a flow step's
        ``inputs: {candidate: train}``), by key: each the path of a verified, read-only copy of
        the model version on this node (``TRAINHOUSE_INPUT_<KEY>``), loadable with
        :func:`trainhouse.sdk.load_model`. Outside trainhouse set those variables yourself
        (to a downloaded version: ``trainhouse models download NAME@3 DIR``)."""
        return {
            name.removeprefix(INPUT_PREFIX).lower(): Path(value)
            for name, value in sorted(os.environ.items())
            if name.startswith(INPUT_PREFIX) and value
        }

    # -- hparams ---------------------------------------------------------------------------
    def set_hparams(self, values: dict[str, Any] | None = None, /, **more: Any) -> None:
        """Add or change hparams after ``init`` (a value computed at run time, say): they join
        ``run.hparams`` and the server's record of what the run used (the runs table, ``show``,
        compare). Plain JSON values."""
        self.hparams.update(values or {}, **more)
        self._report_hparams()

    def _report_hparams(self) -> None:
        """Hand the hparams the run uses to the background sender (the main rank, under the
        server): training never waits on the network for them."""
        if self._hparams_sender is not None:
            self._hparams_sender.send(dict(self.hparams))

    # -- metrics ---------------------------------------------------------------------------
    def set_total_steps(self, total: int) -> None:
        """Tell the server how many steps the run has, for progress bars."""
        self._metrics.set_total_steps(total)

    def log(
        self, metrics: dict[str, Any], step: int | None = None, *, all_ranks: bool = False
    ) -> None:
        """Record metric values at ``step`` (default: the last step + 1).

        The main rank speaks for the job: on other ranks this records nothing unless
        ``all_ranks=True``, which keeps every rank's values tagged with its rank.
        Buffered; sent in the background; never blocks on the network. A value that is an
        :class:`~trainhouse.sdk.Image`, :class:`~trainhouse.sdk.Histogram` or
        :class:`~trainhouse.sdk.Table` is logged as media (see :meth:`log_image`).
        """
        if step is None:
            step = self._step + 1
        step = int(step)
        if step > self._step:
            self._step = step
        media = {k: v for k, v in metrics.items() if isinstance(v, (Image, Histogram, Table))}
        for key, item in media.items():
            self._media.log(str(key), item, step)
        if not self.is_main and not all_ranks:
            return
        values = [
            (str(k), finite_or_none(_number(k, v))) for k, v in metrics.items() if k not in media
        ]
        if values:
            self._metrics.log(step, values, all_ranks=all_ranks)

    # -- media -----------------------------------------------------------------------------
    def _media_step(self, step: int | None) -> int:
        """``step``, or the run's current step (the last one logged; 0 before any)."""
        if step is None:
            return max(self._step, 0)
        step = int(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        self._step = max(self._step, step)
        return step

    def log_image(
        self, key: str, image: Any, step: int | None = None, *, caption: str | None = None
    ) -> None:
        """Log an image under ``key`` at ``step`` (default: the current step): a numpy array
        or tensor (H x W, H x W x C or C x H x W; uint8, or floats in [0, 1]), a PIL image, or
        a PNG's bytes or path; sent as a PNG by the main rank, in the background."""
        self._media.log(key, Image(image, caption), self._media_step(step))

    def log_histogram(self, key: str, values: Any, step: int | None = None) -> None:
        """Log the distribution of a tensor's (or array's) values under ``key`` at ``step``:
        the server buckets them (64 buckets; NaN and infinities counted apart)."""
        self._media.log(key, Histogram(values), self._media_step(step))

    def log_table(
        self,
        key: str,
        rows: list[list[Any]] | None = None,
        columns: list[str] | None = None,
        step: int | None = None,
        *,
        data: Any = None,
    ) -> None:
        """Log a small table under ``key`` at ``step``: ``rows`` of cells under ``columns``,
        or ``data=`` a pandas DataFrame or a list of dicts (at most 1000 rows, 50 columns)."""
        self._media.log(key, Table(columns, rows, data=data), self._media_step(step))

    # -- models ----------------------------------------------------------------------------
    def save_model(
        self,
        name: str,
        model: Any,
        *,
        example_inputs: Any,
        metrics: dict[str, Any] | None = None,
        loader: str | None = None,
        step: int | None = None,
    ) -> dict[str, Any] | None:
        """Save ``model`` as a new version of the model ``name``. Collective: every rank calls
        it; the main rank writes.

        ``torch.export`` captures it with a dynamic batch dimension (dimension 0 of each of
        ``example_inputs``, a tensor or a tuple of tensors); the program (``.pt2``), the
        weights (safetensors) and a record (signature, torch version, job, attempt, step, code
        digest, ``metrics``, each file's sha256) are written atomically next to the job's
        checkpoints and registered with the server. A model ``torch.export`` cannot capture
        raises ModelError naming the reason; ``loader="serve.py:load"`` (a function of the
        job's code that takes the weights and returns the model) saves the weights only.
        ``step`` defaults to the last step logged. Returns the record on the main rank (with
        ``version`` under the server), None on the others.
        """
        from trainhouse.core.errors import ModelError
        from trainhouse.sdk._model import write_model
        from trainhouse.sdk.checkpoint._handle import message_of

        comm = self.checkpoint._comm()
        record: dict[str, Any] | None = None
        error: BaseException | None = None
        if self.is_main:
            try:
                record = write_model(
                    self.checkpoint.storage,
                    name,
                    model,
                    example_inputs=example_inputs,
                    metrics={k: _number(k, v) for k, v in (metrics or {}).items()},
                    loader=loader,
                    step=max(self._step, 0) if step is None else int(step),
                    attempt=self.attempt,
                    job_id=self.job_id,
                )
                record = self.checkpoint._registry.register_model(record)
            except BaseException as exc:  # keep the ranks in step, then raise below
                error = exc
        message = comm.broadcast(message_of(error) if error is not None else None)
        if error is not None:
            raise error
        if message is not None:
            raise ModelError(f"rank 0: {message}")
        return record

    # -- artifacts -------------------------------------------------------------------------
    def log_artifact(
        self, path: str | os.PathLike[str], artifact_path: str | None = None
    ) -> list[str]:
        """Keep the file ``path`` (or every file below the directory ``path``, under its name)
        with the job, below ``artifact_path`` among its artifacts: listed on the job's page,
        fetched with ``trainhouse artifacts``; standalone, copied into ``./artifacts/``. Any
        rank may call it. Returns the artifact paths (``sdk/_artifacts.py``)."""
        from trainhouse.sdk._artifacts import log_artifact

        return log_artifact(self._job, path, artifact_path)

    # -- stopping --------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """True once the server asks this job to stop (cancel, preemption, time limit).

        Collective: every rank must call it the same number of times, and every rank gets the
        same answer at the same call. Ranks agree through one small all-reduce about every
        half second of training, not at every call.
        """
        return self._preemption.should_stop()

    @property
    def stop_reason(self) -> str | None:
        """Why the server asked this job to stop, once it did: ``pruned`` (a search's pruner
        ended the trial), ``canceled by request``, the preemption's reason, ... (the main
        rank's word; None before any request, and in a standalone run)."""
        return self._preemption.signal.reason()

    # -- end -------------------------------------------------------------------------------
    def _finish_at_exit(self) -> None:
        # without a `with` block we cannot tell a crash from a normal end: no barrier, which
        # would hang a crashed rank while the others wait in another collective
        self.finish(failed=True)

    def finish(self, *, failed: bool = False) -> None:
        """Flush metrics and leave torch.distributed cleanly (idempotent)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._finish_at_exit)
        # a checkpoint still being written in the background is waited for (and registered)
        ckpt_error = self.checkpoint._close(collective=not failed)
        if ckpt_error is not None and failed:
            log.error("trainhouse: %s", ckpt_error)
        if self._hparams_sender is not None:
            self._hparams_sender.close()
        self._media.close()
        self._metrics.close()
        self._dist.close(failed=failed)
        if ckpt_error is not None and not failed:
            raise ckpt_error
        if not failed:
            self._record_clean_finish()

    def _record_clean_finish(self) -> None:
        """Tell the rank wrapper that this rank's run ended cleanly, its process group left.

        torch 2.13's gloo keeps worker threads (held by a DDP module that outlives the group)
        that free their last work after the script ends; one that reaches for the GIL while
        the interpreter tears down aborts the process ("terminate called without an active
        exception"). The wrapper keeps such a rank's exit at 0, saying so in its log, only
        after this record and only for that abort (:mod:`trainhouse.executors.node.rank`).
        """
        if self._attempt_layout is None or self.world_size <= 1:
            return
        path = self._attempt_layout.rank_finished(self.rank)
        with contextlib.suppress(OSError):
            path.write_text(f"{time.time():.6f}")

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        if exc is not None and not isinstance(exc, SystemExit):
            # the rank's traceback reaches its log before anything that could wait on peers
            # (a peer may sit in a collective for good); it is not printed a second time
            _print_now(exc)
        sys.stdout.flush()
        self.finish(failed=exc_type is not None)
        sys.stdout.flush()

    def __repr__(self) -> str:
        mode = "standalone" if self.standalone else f"job {self.job_id} attempt {self.attempt}"
        return f"<Run {mode} rank {self.rank}/{self.world_size} on {self.device}>"


def init(
    *,
    hparams: dict[str, Any] | None = None,
    total_steps: int | None = None,
    backend: str | None = None,
) -> Run:
    """Start a run: sets up torch.distributed when WORLD_SIZE > 1 and connects to the server.

    ``hparams`` are defaults; the job spec's ``hparams`` override them, and the merged set (the
    run's ``run.hparams``) is reported to the server, which flags a spec key that is not among
    the defaults. ``total_steps`` lets the CLI show a progress bar.
    """
    return Run(hparams=hparams, total_steps=total_steps, backend=backend)
