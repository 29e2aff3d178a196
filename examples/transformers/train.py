"""A tiny BERT fine-tuned with the Hugging Face Trainer, reporting to trainhouse.

The model is built from a config with random weights and the data are synthetic token
sequences (the label says whether token 7 occurs): nothing is downloaded. The only trainhouse
line in the training code is the callback; ``trainhouse.init()`` here just lets the job spec's
hparams reach the script.

    trainhouse submit trainhouse.yaml            # under the server
    python train.py                              # standalone: metrics on the console

Under the server every logging step reaches the job's metrics, the TrainingArguments its
hparams, every ``checkpoint-N/`` the Trainer saves is registered as the job's checkpoint (with
its sha256), a cancel or preemption makes the Trainer save and stop, and a restart resumes the
Trainer from the job's latest good checkpoint.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import trainhouse
from trainhouse.integrations.transformers import TrainhouseCallback

DEFAULTS = {"max_steps": 60, "save_steps": 20, "lr": 0.002, "batch_size": 16, "seed": 0}
VOCAB, LENGTH, MARK = 64, 16, 7


class Sequences(Dataset[dict[str, torch.Tensor]]):
    """``n`` random token sequences; half of them hold the token ``MARK`` somewhere."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(MARK + 1, VOCAB, (n, LENGTH), generator=g)
        self.labels = (torch.rand(n, generator=g) < 0.5).long()
        where = torch.randint(0, LENGTH, (n,), generator=g)
        marked = self.labels.bool()
        self.ids[marked, where[marked]] = MARK

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


def main() -> None:
    run = trainhouse.init(hparams=DEFAULTS)
    hp = run.hparams
    torch.manual_seed(int(hp["seed"]))
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir="hf-output",
        max_steps=int(hp["max_steps"]),
        per_device_train_batch_size=int(hp["batch_size"]),
        learning_rate=float(hp["lr"]),
        logging_steps=1,
        save_strategy="steps",
        save_steps=int(hp["save_steps"]),
        seed=int(hp["seed"]),
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Sequences(4096, int(hp["seed"])),
        callbacks=[TrainhouseCallback(run)],
    )
    trainer.train()


if __name__ == "__main__":
    main()
