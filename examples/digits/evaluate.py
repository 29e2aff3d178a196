"""Evaluate a saved digits model on the held-out digits: the flow's second step.

The model comes in as an input (``inputs: {candidate: train}`` in ``flow.yaml``: the version
the train step saved last), staged by trainhouse as a verified, read-only copy on this node
(``run.inputs["candidate"]``) and loaded with ``trainhouse.sdk.load_model`` (no pickle runs).
It reports ``val_acc`` and ``val_loss``; with ``promote:`` in ``evaluate.yaml`` the candidate
becomes ``digits-cnn@champion`` when its ``val_acc`` beats the champion's.

Alone:  trainhouse submit evaluate.yaml --set inputs.candidate=digits-cnn@latest
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from train import datasets

import trainhouse
from trainhouse.sdk import load_model

DEFAULTS = {"seed": 0}


@torch.no_grad()
def main() -> None:
    with trainhouse.init(hparams=DEFAULTS) as run:
        if "candidate" not in run.inputs:
            raise SystemExit(
                "no model to evaluate: give one with inputs: {candidate: job:ID} or "
                "{candidate: NAME@VERSION} (TRAINHOUSE_INPUT_CANDIDATE)"
            )
        model = load_model(run.inputs["candidate"])
        _, val = datasets(int(run.hparams["seed"]))
        x, y = val.tensors
        out = model(x)
        val_loss = F.cross_entropy(out, y).item()
        val_acc = (out.argmax(1) == y).float().mean().item()
        # the sum of the outputs: a reader checks the job saw exactly the saved model
        run.log({"val_acc": val_acc, "val_loss": val_loss, "output_sum": out.sum().item()}, step=0)
        print(
            f"evaluated {run.inputs['candidate']}: val_acc={val_acc:.4f} val_loss={val_loss:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
