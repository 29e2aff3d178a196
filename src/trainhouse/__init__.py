"""trainhouse: a self-hosted training server. This module is the SDK a training script imports.

import trainhouse

with trainhouse.init() as run:
    state = run.checkpoint.load()
    ...
    run.log({"loss": loss}, step=step)
"""

from trainhouse._version import __version__
from trainhouse.sdk.run import Run, init

__all__ = ["Run", "__version__", "init"]
