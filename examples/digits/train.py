"""A small CNN on scikit-learn's handwritten digits (8x8 images), trained with DDP.

Runs the same way everywhere:
    trainhouse submit trainhouse.yaml            # under the server, 2 ranks
    torchrun --nproc-per-node 2 train.py         # bare torchrun, standalone
    python train.py                              # one process, standalone
It resumes from its latest checkpoint when restarted, at the exact next batch: the checkpoint
holds the sampler's position (``ResumableSampler``) and every rank's RNG states (saved and
restored by ``run.checkpoint`` itself). It checkpoints at the end of every epoch (in the
background: ``blocking=False``; every ``checkpoint_epochs``-th epoch and the last if set, 0: the
last only), every ``checkpoint_every`` steps if set, and when asked to stop.
With ``--set hparams.save_model=NAME`` it saves the trained model to the registry at the end
(``run.save_model``: ``trainhouse models show NAME``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import trainhouse
from trainhouse.sdk.data import ResumableSampler

DEFAULTS = {
    "epochs": 30,
    "lr": 0.002,
    "batch_size": 32,
    "seed": 0,
    "checkpoint_every": 0,
    "checkpoint_epochs": 1,
    # a model name: at the end, save the trained model to the registry (run.save_model)
    "save_model": "",
}


# what each hparam must be: a bad one ends the run with exit code 2, which trainhouse never
# restarts (no_restart_on's default exit codes): another attempt would fail the same way
RULES: dict[str, tuple[type, Callable[[float], bool], str]] = {
    "epochs": (int, lambda v: v >= 0, "a whole number of epochs, 0 or more (0: no training)"),
    "lr": (float, lambda v: 0 < v < 10, "a learning rate above 0 and below 10"),
    "batch_size": (int, lambda v: v >= 1, "a whole number, at least 1"),
    "seed": (int, lambda v: v >= 0, "a whole number, 0 or more"),
    "checkpoint_every": (int, lambda v: v >= 0, "steps between checkpoints (0: each epoch)"),
    "checkpoint_epochs": (
        int,
        lambda v: v >= 0,
        "epochs between the end-of-epoch checkpoints (0: the last epoch's only)",
    ),
}


def check_hparams(hp: dict) -> None:
    """Exit with code 2, naming each bad hparam, before any work is done."""
    bad = []
    for key, (kind, ok, wanted) in RULES.items():
        value = hp.get(key)
        try:
            number = kind(value)
            valid = number == float(value) and ok(number) if kind is int else ok(number)
        except (TypeError, ValueError):
            valid = False
        if not valid:
            bad.append(f"hparams.{key} must be {wanted}, got {value!r}")
    if bad:
        print("bad hparams (not restarted: it would fail the same way):", file=sys.stderr)
        print("\n".join(f"  {line}" for line in bad), file=sys.stderr, flush=True)
        raise SystemExit(2)


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def datasets(seed: int) -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return TensorDataset(x_train, y_train), TensorDataset(x_val, y_val)


def loaders(
    seed: int, batch_size: int, rank: int, world_size: int
) -> tuple[DataLoader, ResumableSampler, DataLoader]:
    train, val = datasets(seed)
    # a drop-in for DistributedSampler that can resume mid-epoch
    sampler = ResumableSampler(
        train, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    return (
        DataLoader(train, batch_size=batch_size, sampler=sampler),
        sampler,
        DataLoader(val, batch_size=256),
    )


def train_epoch(
    model: nn.Module,
    optim: torch.optim.Optimizer,
    loader: DataLoader,
    first_step: int,
    on_step: Callable[[int, float, int], bool] | None = None,
    device: torch.device | None = None,
) -> tuple[float, int, float, bool]:
    """One pass over ``loader``; returns (mean loss, samples seen, seconds, stopped early).

    ``on_step(step, loss, batches_done)`` returning True ends the pass early.
    """
    model.train()
    total, samples, step = 0.0, 0, first_step
    start = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        optim.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optim.step()
        value = loss.item()
        total += value * len(y)
        samples += len(y)
        if on_step is not None and on_step(step, value, i + 1):
            return total / max(samples, 1), samples, time.perf_counter() - start, True
        step += 1
    return total / max(samples, 1), samples, time.perf_counter() - start, False


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, device: torch.device | None = None
) -> tuple[float, float]:
    model.eval()
    loss, correct, n = 0.0, 0, 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss += F.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
        n += len(y)
    return loss / n, correct / n


def main() -> None:
    with trainhouse.init(hparams=DEFAULTS) as run:
        hp = run.hparams
        check_hparams(hp)
        torch.manual_seed(int(hp["seed"]))
        batch_size = int(hp["batch_size"])
        train_loader, sampler, val_loader = loaders(
            int(hp["seed"]), batch_size, run.rank, run.world_size
        )
        steps_per_epoch = len(train_loader)
        epochs = int(hp["epochs"])
        every = int(hp["checkpoint_every"])
        every_epochs = int(hp["checkpoint_epochs"])
        run.set_total_steps(epochs * steps_per_epoch)

        print(
            f"rank {run.rank}/{run.world_size}: {len(sampler)} training samples per epoch "
            f"on {run.device}",
            flush=True,
        )
        model = DigitsCNN().to(run.device)  # this rank's GPU under NCCL, else the CPU
        ddp = DDP(model) if run.world_size > 1 else model
        optim = torch.optim.Adam(ddp.parameters(), lr=float(hp["lr"]))

        step = 0  # the next training step
        state = run.checkpoint.load()  # also restores every rank's RNG states
        if state is not None:
            model.load_state_dict(state["model"])
            optim.load_state_dict(state["optim"])
            sampler.load_state_dict(state["data"])  # the epoch and the next sample
            step = int(state["step"]) + 1
            if run.is_main:
                print(
                    f"resumed from the checkpoint of step {state['step']} (epoch "
                    f"{state['epoch']}); going on at epoch {sampler.epoch}, step {step}",
                    flush=True,
                )

        def save(
            epoch: int,
            last: int,
            batches_done: int,
            metrics: dict[str, float] | None = None,
            blocking: bool = True,
        ) -> None:
            state = {
                "model": model.state_dict(),
                "optim": optim.state_dict(),
                "epoch": epoch,
                "step": last,
                # what the loop consumed, not what the loader prefetched
                "data": sampler.state_dict(batches_done=batches_done, batch_size=batch_size),
            }
            if blocking:
                run.checkpoint.save(state, step=last, metrics=metrics)
            else:
                run.checkpoint.save(state, step=last, metrics=metrics, blocking=False)

        stopping = False
        for epoch in range(sampler.epoch, epochs):
            sampler.set_epoch(epoch)  # keeps a position loaded for this epoch
            batches = len(train_loader)  # fewer than steps_per_epoch after a mid-epoch resume

            def on_step(
                at: int, loss: float, batches_done: int, epoch: int = epoch, batches: int = batches
            ) -> bool:
                nonlocal stopping
                run.log({"loss": loss}, step=at)
                stopping = run.should_stop()  # same answer on every rank
                if stopping or (every and (at + 1) % every == 0 and batches_done < batches):
                    save(epoch, at, batches_done)
                return stopping

            first = step
            train_loss, samples, seconds, stopped = train_epoch(
                ddp, optim, train_loader, first, on_step, run.device
            )
            if stopped:
                print(f"rank {run.rank}: stopping in epoch {epoch} as asked", flush=True)
                break
            step = first + batches
            last = step - 1
            val_loss, val_acc = evaluate(model, val_loader, run.device)
            run.log(
                {
                    "epoch": epoch,
                    "train_loss": train_loss,
                    "val_loss": val_loss,
                    "val_acc": val_acc,
                    "samples_per_s": samples * run.world_size / seconds,
                },
                step=last,
            )
            if run.is_main:
                print(
                    f"epoch {epoch}: train_loss={train_loss:.4f} val_loss={val_loss:.4f} "
                    f"val_acc={val_acc:.4f}",
                    flush=True,
                )
            stopping = stopping or run.should_stop()
            if (
                stopping
                or epoch == epochs - 1
                or (every_epochs and (epoch + 1) % every_epochs == 0)
            ):
                # written in the background while the next epoch trains; finish() waits for it
                metrics = {"val_loss": val_loss, "val_acc": val_acc}
                save(epoch, last, batches, metrics, blocking=False)
            if stopping:
                print(f"rank {run.rank}: stopping after epoch {epoch} as asked", flush=True)
                break
        if hp["save_model"] and not stopping:
            # collective: every rank calls it, the main rank exports, writes and registers
            x_val = val_loader.dataset.tensors[0]
            val_loss, val_acc = evaluate(model, val_loader, run.device)
            saved = run.save_model(
                str(hp["save_model"]),
                model,
                example_inputs=(x_val[:4].to(run.device),),
                metrics={"val_loss": val_loss, "val_acc": val_acc},
                step=max(step - 1, 0),
            )
            if saved is not None:
                print(f"saved model {saved['name']} version {saved.get('version')}", flush=True)


if __name__ == "__main__":
    main()
