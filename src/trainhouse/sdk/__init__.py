"""The SDK a training script uses: ``trainhouse.init()`` returns a :class:`Run`.

Imports the standard library, httpx and torch only (never the server's dependencies).
"""

from trainhouse.sdk.checkpoint import Checkpointer, load_checkpoint
from trainhouse.sdk.run import Run, init

__all__ = ["Checkpointer", "Run", "init", "load_checkpoint"]
