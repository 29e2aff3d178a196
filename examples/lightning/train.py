"""A small LightningModule trained with PyTorch Lightning, reporting to trainhouse.

A two-layer network learns a fixed random linear map on synthetic data (nothing is
downloaded). trainhouse enters through the logger and the callback; ``trainhouse.init()`` here
just lets the job spec's hparams reach the script.

    trainhouse submit trainhouse.yaml            # under the server
    python train.py                              # standalone: metrics on the console

Under the server ``self.log`` reaches the job's metrics, ``save_hyperparameters()`` its
hparams, every checkpoint Lightning writes is registered as the job's checkpoint (with its
sha256), a cancel or preemption makes the trainer save and stop, and a restart resumes
``fit`` from the job's latest good checkpoint.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainhouse
from trainhouse.integrations.lightning import TrainhouseCallback, TrainhouseLogger

DEFAULTS = {"max_steps": 60, "save_steps": 20, "lr": 0.01, "batch_size": 32, "seed": 0}


class Regressor(L.LightningModule):
    def __init__(self, lr: float, hidden: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])


def main() -> None:
    run = trainhouse.init(hparams=DEFAULTS)
    hp = run.hparams
    L.seed_everything(int(hp["seed"]), verbose=False)
    x = torch.randn(4096, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(4096, 1)
    data = DataLoader(TensorDataset(x, y), batch_size=int(hp["batch_size"]), shuffle=True)
    trainer = L.Trainer(
        max_steps=int(hp["max_steps"]),
        accelerator="cpu",
        devices=1,
        logger=TrainhouseLogger(run),
        callbacks=[
            ModelCheckpoint(dirpath="lightning-output", every_n_train_steps=int(hp["save_steps"])),
            TrainhouseCallback(run),
        ],
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(lr=float(hp["lr"])), data)


if __name__ == "__main__":
    main()
