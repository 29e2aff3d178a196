"""Step ``sdk``: the SDK on one rank, standalone (no server, checkpoints under ./checkpoints).

``run.device`` is the GPU; a ~1B-parameter bf16 GPT with Adam is saved blocking and then in
the background while training goes on, each reloaded into a fresh model and optimizer and
compared bit for bit with a CPU snapshot taken at the save; the CUDA RNG comes back with each
load. Then the SDK's stager copies the state to page-locked CPU buffers twice, timed: the first
time allocates them, the second reuses them, as a run's later background saves do.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from _gpu.common import Results, gib, millions, sizes, step_main
from _gpu.gpt import GPT, batches, optimizer, sync
from _gpu.roundtrip import State, Trainer, check_saves, leaves, nbytes


def body(results: Results, args: argparse.Namespace) -> None:
    import trainhouse

    size = sizes(args.smoke)
    cfg = size.big
    started = time.monotonic()
    with trainhouse.init() as run:
        want = "cpu" if args.smoke else "cuda:0"
        results.check("run.device", str(run.device) == want, f"{run.device} (expected {want})")
        device = run.device
        torch.manual_seed(0)
        with torch.device(device):
            model = GPT(cfg)
        model.to(torch.bfloat16)
        opt = optimizer(model)
        train = Trainer(model, opt, batches(cfg, size.big_batch, 2, device))

        def state() -> State:
            return {"model": model.state_dict(), "optim": opt.state_dict()}

        def reload() -> State:
            loaded = run.checkpoint.load()
            if loaded is None:
                raise RuntimeError("run.checkpoint.load() found no checkpoint")
            with torch.device("meta"):
                fresh = GPT(cfg).to(torch.bfloat16)
            fresh = fresh.to_empty(device=device)
            fresh_opt = optimizer(fresh)
            fresh.load_state_dict(loaded["model"])
            fresh_opt.load_state_dict(loaded["optim"])
            return {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}

        for _ in range(3):
            train()
        results.info(
            "model",
            f"GPT of {millions(cfg.params)} parameters ({cfg.layers} layers, d_model "
            f"{cfg.d_model}), bf16, Adam: {gib(nbytes(state()))} of state",
            params=cfg.params,
        )
        check_saves(
            results,
            run,
            label="1 rank",
            sharded=False,
            device=device,
            train=train,
            state=state,
            reload=reload,
            budget=max(30.0, args.budget - (time.monotonic() - started) - 60),
        )
        staging(results, state(), device)


def staging(results: Results, state: State, device: torch.device) -> None:
    """Time the SDK's stager (what a background save does before it returns), cold and warm,
    and check its buffers for CUDA tensors are page-locked."""
    from trainhouse.sdk.checkpoint._support import Stager

    stager = Stager()
    size = nbytes(state)
    rates = []
    staged: Any = None
    for _ in range(2):
        sync(device)
        start = time.perf_counter()
        staged = stager(state)
        rates.append(size / (time.perf_counter() - start) / 1e9)
    results.info(
        "staging (SDK Stager)",
        f"{gib(size)} device -> CPU: {rates[0]:.2f} GB/s allocating and page-locking "
        f"its buffers, {rates[1]:.2f} GB/s reusing them",
        cold_gb_per_s=rates[0],
        warm_gb_per_s=rates[1],
    )
    if device.type != "cuda":
        results.skip("staging buffers page-locked", "no CUDA tensors to stage (smoke run)")
    else:
        on_gpu = {p for p, t in _tensors(state) if t.is_cuda}
        buffers = [t for p, t in _tensors(staged) if p in on_gpu]
        pinned = sum(t.is_pinned() for t in buffers)
        results.check(
            "staging buffers page-locked",
            pinned == len(buffers) > 0,
            f"{pinned} of the {len(buffers)} CPU copies of CUDA tensors are pinned "
            "(cudaHostRegister)",
        )
    stager.clear()


def _tensors(state: Any) -> list[tuple[str, torch.Tensor]]:
    return [(p, v) for p, v in leaves(state) if isinstance(v, torch.Tensor)]


if __name__ == "__main__":
    step_main("sdk", body)
