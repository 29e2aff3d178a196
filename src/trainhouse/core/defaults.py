"""Defaults that the spec and a job's own processes both read, without pydantic (the SDK and
the supervisor import this; :mod:`trainhouse.core.spec` fills the spec's fields from it)."""

from __future__ import annotations

__all__ = ["DEFAULT_KEEP_LAST"]

#: checkpoints a job keeps by default (the spec's ``checkpoints.keep_last``; a standalone run's
#: unless ``TRAINHOUSE_KEEP_LAST`` says otherwise)
DEFAULT_KEEP_LAST = 2
