"""Step ``fsdp``: FSDP2 on one rank over NCCL (gloo in a smoke run), sharded checkpoints.

The step's process is rank 0 of a world of 1 (``bench/gpu_check.py`` sets ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``). It joins the process group itself,
as a script that manages its own group does (the SDK joins one only for more than one rank),
shards a GPT with ``fully_shard``, and saves it through ``run.checkpoint.save(...,
sharded=True)`` blocking and then in the background while training goes on; each is loaded in
place with ``run.checkpoint.load(template)`` and ``set_state_dict`` and compared bit for bit
with a CPU snapshot taken at the save. The group is destroyed at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from _gpu.common import Results, millions, sizes, step_main
from _gpu.gpt import GPT, batches, optimizer
from _gpu.roundtrip import State, Trainer, check_saves


def body(results: Results, args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    import trainhouse

    size = sizes(args.smoke)
    cfg = size.sharded
    started = time.monotonic()
    cuda = torch.cuda.is_available()
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        if not args.smoke:
            results.add("FAIL", "CUDA", "torch sees no CUDA device")
            return
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        backend = str(dist.get_backend())
        want = "gloo" if args.smoke else "nccl"
        results.check(
            "process group",
            backend == want and dist.get_world_size() == 1,
            f"backend {backend} (expected {want}), world size {dist.get_world_size()}, "
            f"MASTER_PORT {os.environ.get('MASTER_PORT')}",
        )
        with trainhouse.init() as run:
            results.check("run.device", run.device == device, f"{run.device} (expected {device})")
            torch.manual_seed(0)
            with torch.device(device):
                model = GPT(cfg)
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            opt = optimizer(model)
            train = Trainer(model, opt, batches(cfg, size.sharded_batch, 2, device))

            def state() -> State:
                msd, osd = get_state_dict(model, opt)
                return {"model": msd, "optim": osd}

            def reload() -> State:
                template = state()
                run.checkpoint.load(template)
                set_state_dict(
                    model,
                    opt,
                    model_state_dict=template["model"],
                    optim_state_dict=template["optim"],
                )
                return state()

            for _ in range(3):
                train()
            results.info(
                "model",
                f"GPT of {millions(cfg.params)} parameters, fp32 under bf16 autocast, "
                "fully_shard per block and at the root, Adam",
                params=cfg.params,
            )
            check_saves(
                results,
                run,
                label="FSDP2",
                sharded=True,
                device=device,
                train=train,
                state=state,
                reload=reload,
                budget=max(20.0, args.budget - (time.monotonic() - started) - 30),
            )
    finally:
        start = time.perf_counter()
        dist.destroy_process_group()
        results.check(
            "process group destroyed",
            not dist.is_initialized(),
            f"in {time.perf_counter() - start:.2f} s",
        )


if __name__ == "__main__":
    step_main("fsdp", body)
