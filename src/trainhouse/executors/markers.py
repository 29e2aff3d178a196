"""What every executor's processes carry, and how to find them (standard library and psutil).

Every process of an attempt carries ``TRAINHOUSE_RUN_MARKER`` in its environment: torchrun puts
each rank in a session of its own, so a process-group signal does not reach them all, but a
scan for the marker does. Shared by the local executor and the Ray node agent.
"""

from __future__ import annotations

import os

import psutil

MARKER_ENV = "TRAINHOUSE_RUN_MARKER"
LAUNCHER_EXIT = "exit-launcher"  # in an attempt's directory: "CODE TIME" of torchrun


def find_marked(marker: str) -> list[psutil.Process]:
    """Every live process of this machine whose environment carries ``marker``."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(MARKER_ENV) == marker:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found
