"""``trainhouse.init()`` and the Run a training script talks to.

Under the server (``TRAINHOUSE_JOB_ID`` set by the executor) metrics go to the server and
checkpoints to the job's directory. Anywhere else (``python train.py`` or bare ``torchrun``) the
run is standalone: metrics print to the console and checkpoints go to ``./checkpoints``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainhouse.layout import CHECKPOINT_URL_ENV, JobEnv
from trainhouse.sdk._metrics import Point, Reporter, finite_or_none
from trainhouse.sdk._transport import JobAPI
from trainhouse.sdk.checkpoint import Checkpointer

if TYPE_CHECKING:
    import torch

log = logging.getLogger("trainhouse")

# How often (in seconds of training) the ranks agree on should_stop(); see Run.should_stop.
STOP_SYNC_SECONDS = 0.5


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


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Run:
    """One attempt of a training job as seen from one rank."""

    def __init__(
        self,
        *,
        hparams: dict[str, Any] | None = None,
        total_steps: int | None = None,
        backend: str | None = None,
    ) -> None:
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.is_main = self.rank == 0
        job = JobEnv.from_env()
        self.job_id: int | None = job.job_id if job is not None else None
        self.attempt = job.attempt if job is not None else 1
        self.standalone = job is None
        self.hparams: dict[str, Any] = dict(hparams or {})
        if job is not None:
            self.hparams.update(job.hparams)
        self._step = -1
        self._closed = False
        self._owns_group = False
        self._stop_agreed = False
        self._stop_calls = 0
        self._next_sync = 1
        self._synced_at = 0
        self._last_sync = time.monotonic()
        self._last_print = 0.0
        self._printed_step: int | None = None
        self._last_values: tuple[int, list[tuple[str, float | None]]] | None = None
        self.device = self._setup_device()
        self._setup_distributed(backend)
        self._api: JobAPI | None = None
        self._reporter: Reporter | None = None
        location: str | Path
        if job is not None:
            self._api = JobAPI(job.url, job.job_id, job.token)
            if self.is_main:
                self._reporter = Reporter(self._api, self.attempt)
            location = job.checkpoints  # a directory or a URL (any fsspec one)
        else:  # a URL given by hand (any fsspec one) replaces ./checkpoints
            location = os.environ.get(CHECKPOINT_URL_ENV) or Path("checkpoints").resolve()
        self.checkpoint = Checkpointer(self, location)
        if total_steps is not None:
            self.set_total_steps(total_steps)
        atexit.register(self._finish_at_exit)

    # -- setup -----------------------------------------------------------------------------
    def _setup_device(self) -> torch.device:
        import torch

        if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "":
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _setup_distributed(self, backend: str | None) -> None:
        if self.world_size <= 1:
            return
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(
                backend or ("nccl" if self.device.type == "cuda" else "gloo"),
                device_id=self.device if self.device.type == "cuda" else None,
            )
            self._owns_group = True

    def _distributed(self) -> bool:
        if self.world_size <= 1:
            return False
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def _barrier(self) -> None:
        if self._distributed():
            import torch.distributed as dist

            dist.barrier()

    def _broadcast(self, obj: Any) -> Any:
        """The main rank's ``obj`` on every rank."""
        if not self._distributed():
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # -- metrics ---------------------------------------------------------------------------
    def set_total_steps(self, total: int) -> None:
        """Tell the server how many steps the run has, for progress bars."""
        if self._reporter is not None:
            self._reporter.total_steps = int(total)

    def log(
        self, metrics: dict[str, Any], step: int | None = None, *, all_ranks: bool = False
    ) -> None:
        """Record metric values at ``step`` (default: the last step + 1).

        The main rank speaks for the job: on other ranks this records nothing unless
        ``all_ranks=True``, which keeps every rank's values tagged with its rank.
        Buffered; sent in the background; never blocks on the network.
        """
        if step is None:
            step = self._step + 1
        step = int(step)
        if step > self._step:
            self._step = step
        if not self.is_main and not all_ranks:
            return
        now = time.time()
        values = [(str(k), finite_or_none(_number(k, v))) for k, v in metrics.items()]
        self._last_values = (step, values)
        if self.standalone:
            if self.is_main and (now - self._last_print >= 1.0 or step == 0):
                self._print(step, values)
            return
        points: list[Point] = []
        if self.is_main:
            points.extend((step, k, v, None, now) for k, v in values)
        if all_ranks:
            points.extend((step, k, v, self.rank, now) for k, v in values)
            if self._reporter is None and self._api is not None:
                self._reporter = Reporter(self._api, self.attempt)
        if self._reporter is not None:
            self._reporter.add(points)

    def _print(self, step: int, values: list[tuple[str, float | None]]) -> None:
        self._last_print = time.time()
        self._printed_step = step
        shown = " ".join(f"{k}={v:.4g}" if v is not None else f"{k}=nan" for k, v in values)
        print(f"[trainhouse] step {step}: {shown}", flush=True)

    def _flush_metrics(self, retry_for: float = 60.0) -> None:
        """Send everything logged so far, now (retrying while the server is away)."""
        if self._reporter is not None:
            self._reporter.flush(retry_for=retry_for)

    # -- stopping --------------------------------------------------------------------------
    def _local_stop(self) -> bool:
        return self._reporter is not None and self._reporter.stop_requested.is_set()

    def should_stop(self) -> bool:
        """True once the server asks this job to stop (cancel, preemption, time limit).

        Collective: every rank must call it the same number of times, and every rank gets the
        same answer at the same call. Ranks agree through one small all-reduce about every
        half second of training, not at every call.
        """
        if self._stop_agreed:
            return True
        if not self._distributed():
            self._stop_agreed = self._local_stop()
            return self._stop_agreed
        self._stop_calls += 1
        if self._stop_calls < self._next_sync:
            return False
        import torch
        import torch.distributed as dist

        interval = 0.0
        if self.is_main:
            elapsed = max(time.monotonic() - self._last_sync, 1e-6)
            rate = (self._stop_calls - self._synced_at) / elapsed
            interval = float(min(max(int(rate * STOP_SYNC_SECONDS), 1), 10_000))
        # on the rank's device: an NCCL group has no CPU backend
        flags = torch.tensor([1.0 if self._local_stop() else 0.0, interval], device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        self._last_sync = time.monotonic()
        self._synced_at = self._stop_calls
        self._next_sync = self._stop_calls + max(int(flags[1].item()), 1)
        self._stop_agreed = bool(flags[0].item() > 0)
        return self._stop_agreed

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
        if self.standalone and self.is_main and self._last_values is not None:
            step, values = self._last_values
            if step != self._printed_step:  # the console always shows the final values
                self._print(step, values)
        if self._reporter is not None:
            self._reporter.close()
        if self._api is not None:
            self._api.close()
        if self._owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                if not failed:
                    with contextlib.suppress(RuntimeError):
                        dist.barrier()
                dist.destroy_process_group()
        if ckpt_error is not None and not failed:
            raise ckpt_error

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
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

    ``hparams`` are defaults; the job spec's ``hparams`` override them. ``total_steps`` lets the
    CLI show a progress bar.
    """
    return Run(hparams=hparams, total_steps=total_steps, backend=backend)
