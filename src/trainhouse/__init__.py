"""trainhouse: a self-hosted training server. This module is the SDK a training script imports.

import trainhouse

with trainhouse.init() as run:
    state = run.checkpoint.load()
    ...
    run.log({"loss": loss}, step=step)

The SDK is imported on first use (``trainhouse.init``), so that the CLI, the client and the
processes the server starts for a job (which import ``trainhouse.*`` modules) do not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from trainhouse.sdk import Histogram, Image, Run, Table, init

_SDK = ("Histogram", "Image", "Run", "Table", "init")
__all__ = ["Histogram", "Image", "Run", "Table", "__version__", "init"]


def __getattr__(name: str) -> Any:
    if name in _SDK:
        from trainhouse import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'trainhouse' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_SDK])
