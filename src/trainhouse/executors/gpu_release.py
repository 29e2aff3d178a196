"""Whether a GPU is really free: no process of an ended attempt still holds it.

An attempt has ended once its launcher has; a rank stuck in uninterruptible sleep, or a CUDA
context still being torn down, can hold the GPU's memory for a while after, even past SIGKILL.
An attempt started on that GPU meanwhile fails with out of memory, which its spec may call
permanent. So the local executor offers a GPU only once NVML shows no process on it that
carries the marker of an attempt of this server's that is not running (:class:`GpuRelease`);
until then the GPU is held back, the node says why (``Node.held``), and a job waiting for GPUs
shows it in its reason. Processes of other programs are not trainhouse's to judge: a GPU someone
uses by hand is offered as before. Without NVML (declared GPUs, no driver) nothing is checked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

import psutil

from trainhouse.core.cluster import Node
from trainhouse.jobfs.layout import MARKER_ENV
from trainhouse.jobfs.nvml import Nvml

__all__ = ["GpuRelease"]

log = logging.getLogger(__name__)

CHECK_EVERY = 1.0  # seconds between two NVML readings (the scheduler asks at every tick)
WARN_AFTER = 30.0  # seconds a GPU is held back before the server log says so


def marker_of(pid: int) -> str | None:
    """The attempt marker in a process's environment (None: none, or not ours to read)."""
    try:
        return psutil.Process(pid).environ().get(MARKER_ENV)
    except (psutil.Error, OSError):
        return None


class GpuRelease:
    """Which GPUs of a node processes of ended attempts still hold."""

    def __init__(
        self,
        home_id: str,
        open_nvml: Callable[[], Nvml | None] = Nvml.open,
        read_marker: Callable[[int], str | None] = marker_of,
    ) -> None:
        self.home_id = home_id
        self._open_nvml = open_nvml
        self._read_marker = read_marker
        self._nvml: Nvml | None = None
        self._opened = False
        self._checked: tuple[float, dict[int, str]] | None = None
        self._since: dict[tuple[int, int], float] = {}  # (GPU, PID) -> first seen holding it
        self._warned: set[tuple[int, int]] = set()

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()
        self._nvml, self._opened = None, False

    def held(self, node: Node, running: Collection[str]) -> dict[int, str]:
        """GPU index -> why it is held back, for the GPUs of ``node`` on which NVML shows a
        process of an attempt of this server's whose marker is not in ``running``."""
        if not any(g.uuid for g in node.gpus):
            return {}  # declared GPUs: nothing NVML could tell about them
        now = time.monotonic()
        if self._checked is not None and now - self._checked[0] < CHECK_EVERY:
            return self._checked[1]
        if not self._opened:
            self._nvml, self._opened = self._open_nvml(), True
        out: dict[int, str] = {}
        if self._nvml is not None:
            try:
                holders = self._nvml.holders(g.index for g in node.gpus)
            except Exception:  # an NVML error: assume nothing rather than block every GPU
                log.warning("NVML could not list the GPUs' processes", exc_info=True)
                holders = {}
            out = self._leftovers(holders, running, now)
        self._checked = (now, out)
        return out

    def _leftovers(
        self, holders: dict[int, set[int]], running: Collection[str], now: float
    ) -> dict[int, str]:
        out: dict[int, str] = {}
        seen: set[tuple[int, int]] = set()
        prefix = f"{self.home_id}:"
        for gpu, pids in sorted(holders.items()):
            for pid in sorted(pids):
                marker = self._read_marker(pid)
                if marker is None or not marker.startswith(prefix) or marker in running:
                    continue
                job, _, attempt = marker[len(prefix) :].partition(":")
                key = (gpu, pid)
                seen.add(key)
                since = self._since.setdefault(key, now)
                out.setdefault(
                    gpu,
                    f"GPU {gpu} is still held by process {pid} of job {job}'s attempt {attempt}, "
                    "which has ended: it is offered once released",
                )
                if now - since >= WARN_AFTER and key not in self._warned:
                    self._warned.add(key)
                    log.warning("%s (for %.0f s now)", out[gpu], now - since)
        for key in set(self._since) - seen:
            del self._since[key]
        self._warned &= seen
        return out
