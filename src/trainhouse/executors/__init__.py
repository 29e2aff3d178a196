"""Executors turn placements into processes: ``local`` (torchrun on this machine)."""

from trainhouse.executors.base import Executor, Exit, Launch

__all__ = ["Executor", "Exit", "Launch"]
