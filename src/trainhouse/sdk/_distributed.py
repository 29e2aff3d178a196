"""Where a process stands among the ranks of a run, and the collectives between the ranks.

:func:`connect` reads ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` (set by torchrun), picks the
rank's device and, with more than one rank, joins the default process group unless the script
already did. A process alone gets :class:`SingleProcess`, whose collectives are no-ops and whose
device is picked when first asked for (a script that never uses torch, say scikit-learn's, does
not import it: 1.2-1.7 s of CPU and some 300 MB); ranks of a torch.distributed job get
:class:`ProcessGroup`.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class DistributedContext(ABC):
    """A rank's place in its run (rank, local rank, world size, device) and the collectives
    among the ranks: over the default process group, or over ``group`` where one is given.

    ``broadcast`` and ``all_gather`` move picklable objects, ``all_reduce_max`` a few numbers.
    Every rank must call a collective, in the same order.
    """

    def __init__(
        self, *, rank: int, local_rank: int, world_size: int, device: torch.device | None
    ) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.is_main = rank == 0
        self._device = device

    @property
    def device(self) -> torch.device:
        """The rank's device (its GPU, made the current one, where CUDA is usable; else the
        CPU), picked on first use where it was not given."""
        if self._device is None:
            self._device = _device(self.local_rank)
        return self._device

    @property
    @abstractmethod
    def active(self) -> bool:
        """Whether collectives reach other processes (False: each one is a no-op)."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every rank gets here."""

    @abstractmethod
    def broadcast(self, obj: Any, group: Any = None) -> Any:
        """The main rank's ``obj`` on every rank."""

    @abstractmethod
    def all_gather(self, obj: Any, group: Any = None) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""

    @abstractmethod
    def all_reduce_max(self, values: list[float]) -> list[float]:
        """The element-wise maximum of every rank's ``values``, on every rank."""

    @abstractmethod
    def close(self, *, failed: bool) -> None:
        """Leave the process group this context joined, if it did (idempotent).

        After a normal end (``failed=False``) the ranks first wait for each other, so that no
        rank tears the group down under one still in a collective.
        """


class SingleProcess(DistributedContext):
    """One process alone (no torchrun, or ``WORLD_SIZE=1``): every collective is a no-op.
    ``device`` None: picked when first asked for, as :func:`connect` would."""

    def __init__(
        self,
        *,
        rank: int = 0,
        local_rank: int = 0,
        world_size: int = 1,
        device: torch.device | None = None,
    ) -> None:
        super().__init__(rank=rank, local_rank=local_rank, world_size=world_size, device=device)

    @property
    def active(self) -> bool:
        return False

    def barrier(self) -> None:
        return None

    def broadcast(self, obj: Any, group: Any = None) -> Any:
        return obj

    def all_gather(self, obj: Any, group: Any = None) -> list[Any]:
        return [obj]

    def all_reduce_max(self, values: list[float]) -> list[float]:
        return list(values)

    def close(self, *, failed: bool) -> None:
        return None


class ProcessGroup(DistributedContext):
    """A rank of a torch.distributed job (``WORLD_SIZE`` > 1).

    Collectives are no-ops while no process group is initialized (e.g. after ``close``).
    ``owns_group``: the group was initialized by :func:`connect`, which ``close`` destroys; a
    group the script initialized itself is left to the script.
    """

    def __init__(
        self,
        *,
        rank: int,
        local_rank: int,
        world_size: int,
        device: torch.device,
        owns_group: bool = False,
    ) -> None:
        super().__init__(rank=rank, local_rank=local_rank, world_size=world_size, device=device)
        self._owns_group = owns_group

    @property
    def active(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            dist.barrier()

    def broadcast(self, obj: Any, group: Any = None) -> Any:
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=group)
        return box[0]

    def all_gather(self, obj: Any, group: Any = None) -> list[Any]:
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=group)
        return out

    def all_reduce_max(self, values: list[float]) -> list[float]:
        if not self.active:
            return list(values)
        import torch
        import torch.distributed as dist

        # on the rank's device: an NCCL group has no CPU backend
        flags = torch.tensor(values, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return [float(v) for v in flags.tolist()]

    def close(self, *, failed: bool) -> None:
        """After a failure an NCCL group is aborted, not destroyed: since torch 2.6 destroying
        it flushes NCCL's work and waits for peers that may sit in a collective for good (the
        rank would hang until NCCL's watchdog killed the job, its own failure unreported)."""
        if not self._owns_group:
            return
        self._owns_group = False
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        if failed and "nccl" in str(dist.get_backend()):
            from torch.distributed import distributed_c10d

            distributed_c10d._abort_process_group()
            return
        if not failed:
            with contextlib.suppress(RuntimeError):
                dist.barrier()
        dist.destroy_process_group()


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _device(local_rank: int) -> torch.device:
    """The rank's GPU (made the current one) where CUDA is usable, else the CPU."""
    import torch

    if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def connect(backend: str | None = None) -> DistributedContext:
    """This process's context, from torchrun's variables; joins the default process group when
    there are several ranks and none is initialized yet (``backend``: NCCL on GPUs, else gloo)."""
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:  # its device when first asked for: torch only if the script uses it
        return SingleProcess(rank=rank, local_rank=local_rank, world_size=world_size)
    device = _device(local_rank)
    import torch.distributed as dist

    owns_group = False
    if not dist.is_initialized():
        dist.init_process_group(
            backend or ("nccl" if device.type == "cuda" else "gloo"),
            device_id=device if device.type == "cuda" else None,
        )
        owns_group = True
    return ProcessGroup(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        device=device,
        owns_group=owns_group,
    )
