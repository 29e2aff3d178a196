"""A training script that writes TensorBoard event files only: nothing of trainhouse is
imported. trainhouse gives every job TRAINHOUSE_TENSORBOARD_DIR and imports the scalars written
there as the job's metrics while it runs (tag names kept: train/loss).

    trainhouse submit examples/tensorboard/trainhouse.yaml
"""

import os

import torch
from sklearn.datasets import load_digits
from torch.utils.tensorboard import SummaryWriter

EPOCHS = int(os.environ.get("EPOCHS", "5"))

torch.manual_seed(0)
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

writer = SummaryWriter(os.environ.get("TRAINHOUSE_TENSORBOARD_DIR", "runs"))
step = 0
for epoch in range(EPOCHS):
    for i in range(0, 1400, 100):
        loss = torch.nn.functional.cross_entropy(model(x[i : i + 100]), y[i : i + 100])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        writer.add_scalar("train/loss", loss.item(), step)
        step += 1
    with torch.no_grad():
        acc = (model(x[1400:]).argmax(1) == y[1400:]).float().mean().item()
    writer.add_scalar("val/acc", acc, step)
    writer.flush()
    print(f"epoch {epoch} val/acc {acc:.3f}", flush=True)
writer.close()
