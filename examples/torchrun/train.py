"""A plain torchrun script: DistributedDataParallel over gloo, its own checkpoint file, its
metrics in TensorBoard event files. It imports nothing of trainhouse; run as a job it gets its
logs, resources, restarts and monitoring all the same, and trainhouse imports its TensorBoard
scalars as metrics.

    torchrun --nproc-per-node 2 train.py              # anywhere
    trainhouse submit examples/torchrun/trainhouse.yaml

It resumes from its own checkpoint (CKPT_DIR, TRAINHOUSE_CHECKPOINT_DIR in a job). CRASH_AT
makes the first attempt fail at that step (to see a restart resume it).
"""

import os

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter

STEPS = int(os.environ.get("STEPS", "40"))
CRASH_AT = int(os.environ.get("CRASH_AT", "-1"))
ckpt_dir = os.environ.get("TRAINHOUSE_CHECKPOINT_DIR") or os.environ.get("CKPT_DIR", "ckpt")
ckpt = os.path.join(ckpt_dir, "state.pt")

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt, weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = int(state["step"]) + 1
    print(f"rank {rank} resumes at step {start}", flush=True)
writer = SummaryWriter(os.environ.get("TRAINHOUSE_TENSORBOARD_DIR", "runs")) if rank == 0 else None

for step in range(start, STEPS):
    i = (step * 50 * world + rank * 50) % 1400
    loss = torch.nn.functional.cross_entropy(model(x[i : i + 50]), y[i : i + 50])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if writer is not None:
        writer.add_scalar("train/loss", loss.item(), step)
    if step % 10 == 9 and rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        state = {
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
        }
        torch.save(state, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
        writer.flush()
    dist.barrier()
    if step == CRASH_AT and start == 0:
        raise SystemExit(f"rank {rank}: crashing at step {step} as asked (CRASH_AT)")
if writer is not None:
    writer.close()
print(f"rank {rank} done at step {STEPS - 1}", flush=True)
dist.destroy_process_group()
