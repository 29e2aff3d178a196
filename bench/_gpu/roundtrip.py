"""A checkpoint's round trip through ``run.checkpoint``, for the SDK and the FSDP steps.

:func:`check_round_trip` takes a CPU snapshot of the training state, saves it (blocking, or in
the background while training goes on), checks that training moved the weights past the
snapshot, loads the checkpoint back and compares every tensor bit for bit, and checks that the
RNG of the run's device draws what it drew right after the save.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from _gpu.common import Results, gib
from _gpu.gpt import sync, train_step

State = dict[str, Any]


def leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf of nested dicts, lists and tuples."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{path}.{i}" if path else str(i))
    else:
        yield path, obj


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the whole tensor on one rank), or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def snapshot(state: State) -> dict[str, Any]:
    """Every leaf of ``state``, tensors copied to the CPU (a DTensor's local shard)."""
    out: dict[str, Any] = {}
    for path, value in leaves(state):
        if isinstance(value, torch.Tensor):
            value = _local(value).detach().to("cpu", copy=True)
        out[path] = value
    return out


def nbytes(state: Any) -> int:
    """The bytes of the tensors in ``state`` (a DTensor's local shard), or in a snapshot."""
    tensors = [_local(v) for _, v in leaves(state) if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (unlike ``torch.equal``, -0.0 is not 0.0)."""
    a, b = _local(a), _local(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(_bits(a.cpu()), _bits(b.cpu()))


def differences(expected: dict[str, Any], state: State) -> list[str]:
    """The paths where ``state`` differs from the snapshot ``expected``."""
    actual = dict(leaves(state))
    out = [f"{p} missing" for p in expected if p not in actual]
    out += [f"{p} unexpected" for p in actual if p not in expected]
    for path, want in expected.items():
        if path not in actual:
            continue
        got = actual[path]
        if isinstance(want, torch.Tensor):
            same = isinstance(got, torch.Tensor) and bit_equal(want, got)
        else:
            same = not isinstance(got, torch.Tensor) and got == want
        if not same:
            out.append(path)
    return out


def tensor_count(snap: dict[str, Any]) -> int:
    return sum(isinstance(v, torch.Tensor) for v in snap.values())


class Trainer:
    """One optimizer step per call, over a few fixed batches; ``steps`` counts them."""

    def __init__(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        data: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        self.model = model
        self.opt = opt
        self.data = data
        self.steps = 0

    def __call__(self) -> None:
        x, y = self.data[self.steps % len(self.data)]
        train_step(self.model, self.opt, x, y)
        self.steps += 1


def check_saves(
    results: Results,
    run: Any,
    *,
    label: str,
    sharded: bool,
    device: torch.device,
    train: Trainer,
    state: Callable[[], State],
    reload: Callable[[], State],
    budget: float,
) -> None:
    """:func:`check_round_trip` of a blocking save, then of a background one (``budget``:
    seconds for both)."""
    for blocking in (True, False):
        check_round_trip(
            results,
            run,
            label=label,
            step=train.steps,
            blocking=blocking,
            sharded=sharded,
            device=device,
            state=state,
            train=train,
            reload=reload,
            budget=budget / 3,
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()  # what the reload's copies held, for the next round


def check_round_trip(
    results: Results,
    run: Any,
    *,
    label: str,
    step: int,
    blocking: bool,
    sharded: bool,
    device: torch.device,
    state: Callable[[], State],
    train: Callable[[], None],
    reload: Callable[[], State],
    budget: float,
) -> None:
    """Save ``state()`` as the checkpoint of ``step`` and check it comes back bit-identical.

    ``train()`` takes one optimizer step; ``reload()`` loads the newest checkpoint through
    ``run.checkpoint.load`` into a model and optimizer and returns their state. A background
    save trains while it writes (at least two steps, at most ``budget`` seconds).
    """
    sync(device)
    snap = snapshot(state())
    size = nbytes(snap)
    kind = "blocking" if blocking else "background"
    start = time.perf_counter()
    out = run.checkpoint.save(state(), step=step, sharded=sharded, blocking=blocking)
    returned = time.perf_counter() - start
    expected_draw = torch.rand(64, device=device)  # the RNG as the save stored it, drawn once
    trained = overlapped = 0
    deadline = time.monotonic() + budget
    if blocking:
        record = out
        results.info(
            f"{label}: blocking save",
            f"{gib(size)} in {returned:.1f} s ({size / returned / 1e9:.2f} GB/s, "
            "serialize + sha256 + write + fsync)",
            seconds=returned,
            bytes=size,
        )
        for _ in range(2):
            train()
            trained += 1
    else:
        results.info(
            f"{label}: background save returned",
            f"after {returned:.2f} s: {gib(size)} staged to CPU memory at "
            f"{size / returned / 1e9:.2f} GB/s (the first background save allocates and "
            "page-locks its buffers)",
            seconds=returned,
            bytes=size,
            gb_per_s=size / returned / 1e9,
        )
        while trained < 2 or (not out.done() and time.monotonic() < deadline):
            overlapped += not out.done()
            train()
            trained += 1
        sync(device)
        training = time.perf_counter() - start
        record = run.checkpoint.wait()
        total = time.perf_counter() - start
        results.info(
            f"{label}: background write",
            f"{overlapped} of {trained} training steps started while it was writing "
            f"({training:.1f} s of training); done {total:.1f} s after the save call",
            steps=overlapped,
            seconds=total,
        )
    sync(device)
    moved = len(differences(snap, state()))
    torch.rand(64, device=device)  # moves the RNG on: the load must bring it back
    loaded = reload()
    got_draw = torch.rand(64, device=device)
    wrong = differences(snap, loaded)
    want = "sharded" if sharded else "file"
    got_kind = (record or {}).get("kind")
    detail = (
        f"{tensor_count(snap)} tensors, {gib(size)}; {trained} steps after the save "
        f"changed {moved} of them; checkpoint {(record or {}).get('path')} ({got_kind})"
    )
    if wrong:
        detail += f"; {len(wrong)} differ: {', '.join(wrong[:5])}"
    if not moved:
        detail += "; training did not change the weights, so the comparison proves nothing"
    # a smoke run's state is written before the first step: nothing to overlap
    concurrent = blocking or overlapped > 0 or results.smoke
    if not concurrent:
        detail += "; no training step ran while it was writing"
    results.check(
        f"{label}: {kind} save reloaded bit-identical",
        not wrong and moved > 0 and got_kind == want and concurrent,
        detail,
        tensors=tensor_count(snap),
        bytes=size,
    )
    results.check(
        f"{label}: RNG of {device.type} restored by load",
        bit_equal(expected_draw, got_draw),
        f"torch.rand on {device} after the load draws what it drew right after the {kind} save",
    )
