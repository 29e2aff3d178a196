"""A training script that logs through MLflow only: nothing of trainhouse is imported.

On a laptop, pointed at a trainhouse server, it becomes a tracked run listed with the jobs:
    MLFLOW_TRACKING_URI=http://127.0.0.1:8470/mlflow python examples/mlflow/train.py
Submitted as a job, the job's environment makes MLflow log to the job itself:
    trainhouse submit examples/mlflow/trainhouse.yaml
"""

import os
import tempfile

import mlflow
import torch
from sklearn.datasets import load_digits

EPOCHS = int(os.environ.get("EPOCHS", "5"))
LR = float(os.environ.get("LR", "0.05"))

torch.manual_seed(0)
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)
train_x, val_x, train_y, val_y = x[:1400], x[1400:], y[:1400], y[1400:]
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)

mlflow.set_experiment("digits")
with mlflow.start_run(run_name="digits-mlp"):
    mlflow.log_params({"epochs": EPOCHS, "lr": LR, "hidden": 64})
    step = 0
    for epoch in range(EPOCHS):
        for i in range(0, len(train_x), 100):
            loss = torch.nn.functional.cross_entropy(
                model(train_x[i : i + 100]), train_y[i : i + 100]
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mlflow.log_metric("train/loss", loss.item(), step=step)
            step += 1
        with torch.no_grad():
            acc = (model(val_x).argmax(1) == val_y).float().mean().item()
        mlflow.log_metric("val/acc", acc, step=step)
        print(f"epoch {epoch} val/acc {acc:.3f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.txt")
        with open(path, "w") as f:
            f.write(str(model))
        mlflow.log_artifact(path, artifact_path="model")
