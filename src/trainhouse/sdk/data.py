"""A data sampler that resumes mid-epoch at the exact next sample.

``ResumableSampler`` is a drop-in for ``torch.utils.data.DistributedSampler`` (also fine with
one process): the same deterministic shuffle from ``(seed, epoch)`` and the same split of the
indices among ranks, plus ``state_dict()`` / ``load_state_dict()``.

A ``DataLoader`` draws indices ahead of the training loop (prefetching, worker processes), so the
sampler cannot tell by itself how far training got. The position it saves is what the loop says
it CONSUMED: pass ``batches_done`` (batches of the current pass over the loader) to
``state_dict``, or call ``advance(n)`` after each batch::

    sampler = ResumableSampler(dataset, seed=0)     # rank/world size from torch.distributed
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=2)
    state = run.checkpoint.load()
    if state:
        sampler.load_state_dict(state["data"])       # resumes at state["data"]["epoch"]
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)                     # keeps a loaded mid-epoch position
        for i, (x, y) in enumerate(loader):          # after a resume: only what was left
            train(x, y)
            if stop_or_time_to_save:
                run.checkpoint.save({"model": ..., "data": sampler.state_dict(batches_done=i + 1)},
                                    step=step)

The position is kept as a number of samples of the epoch's global order, so a run can resume
with another world size: the remaining samples are split among the new ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

__all__ = ["ResumableSampler"]


def _dist_default(value: int | None, what: str) -> int:
    if value is not None:
        return int(value)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() if what == "world" else dist.get_rank()
    return 1 if what == "world" else 0


class ResumableSampler(Sampler[int]):
    """Indices of one rank's part of ``dataset`` for the current epoch, resumable mid-epoch.

    Arguments as ``DistributedSampler``: ``num_replicas``/``rank`` default to the
    torch.distributed group (1/0 without one); ``shuffle`` (by ``seed + epoch``); ``drop_last``
    drops the tail that does not divide evenly among ranks instead of padding it by repeating
    indices from the start.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        batch_size: int | None = None,
    ) -> None:
        self.dataset_len = len(dataset)
        self.num_replicas = _dist_default(num_replicas, "world")
        self.rank = _dist_default(rank, "rank")
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is not in [0, {self.num_replicas})")
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        #: the loader's batch size, for ``state_dict(batches_done=...)``
        self.batch_size = batch_size
        self.epoch = 0
        self._start = 0  # global samples of this epoch consumed before the next pass begins
        self._pass_start = 0  # ... before the current pass began
        self._consumed = 0  # samples this rank consumed in the current pass (advance())

    # -- the order -------------------------------------------------------------------------
    def _order(self) -> list[int]:
        """The epoch's global order: every index once, shuffled by (seed, epoch)."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            return torch.randperm(self.dataset_len, generator=g).tolist()
        return list(range(self.dataset_len))

    def _total(self, length: int) -> int:
        """How many of ``length`` samples are drawn (a multiple of the replicas)."""
        if self.drop_last:
            return (length // self.num_replicas) * self.num_replicas
        return math.ceil(length / self.num_replicas) * self.num_replicas

    @staticmethod
    def _fit(indices: list[int], total: int) -> list[int]:
        """``indices`` cut or padded (by repeating from the start, as DistributedSampler) to
        ``total``."""
        if total > len(indices) and indices:
            indices = indices * math.ceil(total / len(indices))
        return indices[:total]

    def _epoch_length(self) -> int:
        return self._total(self.dataset_len)

    def _remaining(self, start: int) -> list[int]:
        """The epoch's global order (padded or cut for the ranks) from ``start`` on."""
        order = self._order()
        rest = self._fit(order, self._total(len(order)))[start:]
        return self._fit(rest, self._total(len(rest)))  # another world size than at the save

    def __iter__(self) -> Iterator[int]:
        start = min(self._start, self._epoch_length())
        indices = self._remaining(start)[self.rank :: self.num_replicas]
        self._pass_start, self._consumed = start, 0
        self._start = 0  # the next pass (same epoch again) starts from the beginning
        return iter(indices)

    def __len__(self) -> int:
        """Samples this rank draws in the next pass (fewer after a mid-epoch resume)."""
        rest = max(self._epoch_length() - self._start, 0)
        return self._total(rest) // self.num_replicas

    # -- position --------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``; a position loaded for this same epoch is kept."""
        if int(epoch) != self.epoch:
            self._start = self._pass_start = self._consumed = 0
        self.epoch = int(epoch)

    def advance(self, samples: int) -> None:
        """Count ``samples`` more samples consumed by this rank in the current pass."""
        self._consumed += int(samples)

    def state_dict(
        self,
        *,
        batches_done: int | None = None,
        batch_size: int | None = None,
        samples_done: int | None = None,
    ) -> dict[str, Any]:
        """The position to resume from: epoch and samples of it consumed (all ranks together).

        At the end of an epoch that is the start of the next one (``epoch + 1``, 0 consumed).

        Tell it what the loop consumed in the current pass over the loader: ``batches_done``
        (times ``batch_size``, or the one given to the constructor), or ``samples_done`` per
        rank; without either, what ``advance()`` counted.
        """
        if batches_done is not None:
            size = batch_size if batch_size is not None else self.batch_size
            if size is None:
                raise ValueError("state_dict(batches_done=...) needs batch_size")
            done = int(batches_done) * int(size)
        elif samples_done is not None:
            done = int(samples_done)
        else:
            done = self._consumed
        rest = self._epoch_length() - self._pass_start
        per_rank = self._total(max(rest, 0)) // self.num_replicas
        done = min(max(done, 0), per_rank)
        epoch, consumed = self.epoch, self._pass_start + done * self.num_replicas
        if done >= per_rank:  # the epoch is over: resume at the start of the next one
            epoch, consumed = epoch + 1, 0
        return {
            "epoch": epoch,
            "consumed": consumed,
            "seed": self.seed,
            "dataset_len": self.dataset_len,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s epoch, at the first sample not consumed yet."""
        if int(state.get("dataset_len", self.dataset_len)) != self.dataset_len:
            raise ValueError(
                f"the saved position is for a dataset of {state['dataset_len']} samples, "
                f"this one has {self.dataset_len}"
            )
        self.epoch = int(state["epoch"])
        self.seed = int(state.get("seed", self.seed))
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self._start = int(state["consumed"])
        self._pass_start, self._consumed = self._start, 0

    def __repr__(self) -> str:
        return (
            f"<ResumableSampler epoch {self.epoch} rank {self.rank}/{self.num_replicas} "
            f"of {self.dataset_len}>"
        )
