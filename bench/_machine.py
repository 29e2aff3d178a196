"""Helpers the benchmarks share: logging to stderr and waiting for a quiet machine.

The benchmarks run as scripts (``python bench/NAME.py``), so this module is imported by its
plain name from the benchmarks' own directory.
"""

from __future__ import annotations

import sys
import time

import psutil

BUSY_PERCENT = 15.0  # CPU use by other processes above which the results are suspect


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def machine_busy(seconds: float = 1.0) -> float:
    """Percent of all CPUs in use over ``seconds`` while this process sleeps."""
    return float(psutil.cpu_percent(interval=seconds))


def wait_quiet(limit: float) -> float:
    """Wait up to ``limit`` seconds for other processes to leave the CPUs; their last use, %."""
    deadline = time.monotonic() + limit
    busy = machine_busy()
    if busy > BUSY_PERCENT and limit > 0:
        log(f"the CPUs are {busy:.0f}% busy; waiting up to {limit:.0f} s for them to settle")
        while busy > BUSY_PERCENT and time.monotonic() < deadline:
            busy = machine_busy()
    return busy
