"""A small GPT (pre-norm transformer blocks, causal attention) and its training loop.

The SDK and FSDP steps of ``bench/gpu_check.py`` build their models from it. As a script it is
the throughput step's training run, the same file bare and through trainhouse:

    python gpt.py --config '{"layers": 6}' --batch 16 --steps 0 --seconds 30
    python gpt.py ... --steps 300 --trainhouse     # as a trainhouse job, reporting with run.log

It is copied alone into the job's workdir, so it imports torch and the standard library only
(trainhouse only with ``--trainhouse``). Every run trains ``--warmup`` steps and then
``--calibrate`` steps untimed; ``--steps 0`` sizes the timed part from the calibration steps to
last about ``--seconds``. The timed part's tokens/s is printed after :data:`RESULT`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

RESULT = "GPT_CHECK_RESULT "


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 50304
    seq: int = 1024
    layers: int = 6
    d_model: int = 768
    heads: int = 12

    @property
    def params(self) -> int:
        """The model's parameter count."""
        d = self.d_model
        block = 12 * d * d + 13 * d  # attention and MLP weights and biases, two LayerNorms
        return self.layers * block + 2 * self.vocab * d + self.seq * d + 2 * d


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab, cfg.d_model)
        self.positions = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln(x))
        return logits


def batches(
    cfg: GPTConfig, batch: int, count: int, device: torch.device, seed: int = 1
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of random tokens (inputs, next-token targets) on ``device``, the same
    for a seed wherever they are made (no data set: nothing is downloaded)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1), generator=gen)
        tokens = tokens.to(device)
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """One optimizer step under bf16 autocast; the loss, still on the device (no sync)."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def optimizer(model: nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


# -- the throughput run ----------------------------------------------------------------------
@dataclass
class Hooks:
    """What differs between the bare run and the one through trainhouse."""

    device: torch.device
    log: Callable[[int, dict[str, float]], None]
    should_stop: Callable[[], bool]


@contextlib.contextmanager
def _hooks(through_trainhouse: bool) -> Iterator[Hooks]:
    if not through_trainhouse:
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        yield Hooks(device, lambda step, values: None, lambda: False)
        return
    import trainhouse

    with trainhouse.init() as run:
        yield Hooks(run.device, lambda step, values: run.log(values, step=step), run.should_stop)


def _timed(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    data: list[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    first: int,
    hooks: Hooks,
    log_every: int,
) -> float:
    """Seconds ``steps`` training steps take, logging the loss every ``log_every`` steps."""
    sync(hooks.device)
    start = time.perf_counter()
    for i in range(steps):
        x, y = data[i % len(data)]
        loss = train_step(model, opt, x, y)
        if (i + 1) % log_every == 0:
            hooks.log(first + i, {"loss": loss.item()})  # the same sync on both sides
        if hooks.should_stop():
            raise SystemExit(f"asked to stop at step {first + i}")
    sync(hooks.device)
    return time.perf_counter() - start


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    cfg = GPTConfig(**json.loads(args.config))
    with _hooks(args.trainhouse) as hooks:
        torch.manual_seed(0)
        model = GPT(cfg).to(hooks.device)
        opt = optimizer(model)
        data = batches(cfg, args.batch, 4, hooks.device)
        never = args.warmup + args.calibrate + 1  # warm-up and calibration log nothing
        _timed(model, opt, data, args.warmup, 0, hooks, never)
        calibration = _timed(model, opt, data, args.calibrate, args.warmup, hooks, never)
        steps = args.steps or max(20, round(args.seconds * args.calibrate / calibration))
        first = args.warmup + args.calibrate
        seconds = _timed(model, opt, data, steps, first, hooks, args.log_every)
        tokens = steps * args.batch * cfg.seq
        hooks.log(first + steps, {"tokens_per_s": tokens / seconds})
        return {
            "steps": steps,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            "device": str(hooks.device),
            "threads": torch.get_num_threads(),
            "params": cfg.params,
            "config": asdict(cfg),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the small GPT on random tokens.")
    parser.add_argument("--config", default="{}", help="GPTConfig fields as JSON")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--calibrate", type=int, default=10, help="untimed steps that size --steps")
    parser.add_argument("--steps", type=int, default=0, help="timed steps (0: about --seconds)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--trainhouse", action="store_true", help="report through the SDK")
    result = throughput(parser.parse_args(argv))
    print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
