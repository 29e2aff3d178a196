"""The names and units of the resource series (the ``system_metrics`` table's ``name``).

A node's CPU and memory and each job's are trainhouse's (Prometheus-style, base units); a GPU's
follow NVIDIA DCGM's field names and units (MiB, W, degrees C, percent), as dcgm-exporter names
them, so dashboards built for it read trainhouse's exposition too. Which GPU values are sampled,
and how, is :data:`trainhouse.jobfs.nvml.GPU_METRICS`.
"""

from __future__ import annotations

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
