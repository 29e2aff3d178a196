"""The names and units of the resource series (the ``system_metrics`` table's ``name``), and
the goal a logged metric's name suggests (:func:`goal_from_name`).

A node's CPU and memory and each job's are trainhouse's (Prometheus-style, base units); a GPU's
follow NVIDIA DCGM's field names and units (MiB, W, degrees C, percent), as dcgm-exporter names
them, so dashboards built for it read trainhouse's exposition too. Which GPU values are sampled,
and how, is :data:`trainhouse.jobfs.nvml.GPU_METRICS`.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "CPU_PERCENT",
    "FB_FREE",
    "FB_USED",
    "GPU_MEMORY",
    "GPU_TEMP",
    "GPU_UTIL",
    "MEMORY_TOTAL",
    "MEMORY_USED",
    "POWER_USAGE",
    "PROCESSES",
    "RSS",
    "goal_from_name",
]

# a node's
CPU_PERCENT = "cpu_percent"  # of all cores: 0..100 (a job's: of one core, so up to 100 x cores)
MEMORY_USED = "memory_used_bytes"  # total - available
MEMORY_TOTAL = "memory_total_bytes"
# a node's GPUs' (labelled by GPU index)
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
FB_USED = "DCGM_FI_DEV_FB_USED"  # framebuffer memory used, MiB
FB_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"  # W
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"  # degrees C
# a job's (its processes on the node, summed)
RSS = "rss_bytes"  # resident memory; pages shared between processes count in each
PROCESSES = "processes"
GPU_MEMORY = "gpu_memory_bytes"  # per GPU, of the job's PIDs (NVML)


# -- a logged metric's goal, guessed from its name (the compare page's "best") ---------------
# words that name something to bring down, or up; matched as whole words of the name
# (val_loss, train/error, top1_acc, eval-F1); the lower words first: "accuracy_loss" is a loss
_LOWER = ("loss", "error", "err", "wer", "cer", "mse", "mae", "rmse", "perplexity", "ppl")
_HIGHER = (
    "acc",
    "accuracy",
    "f1",
    "precision",
    "recall",
    "auc",
    "auroc",
    "map",
    "iou",
    "miou",
    "bleu",
    "rouge",
    "r2",
    "reward",
    "return",
    "score",
    "dice",
)


def goal_from_name(name: str) -> Literal["min", "max"] | None:
    """Whether a logged metric is better lower (``"min"``: loss, error, perplexity) or higher
    (``"max"``: accuracy, F1, AUC, reward), guessed from the words of its name; None when the
    name says neither (``lr``, ``epoch``)."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    words |= {w.rstrip("0123456789") for w in words}  # acc1 -> acc (f1 and r2 stay too)
    if words & set(_LOWER):
        return "min"
    if words & set(_HIGHER):
        return "max"
    return None
