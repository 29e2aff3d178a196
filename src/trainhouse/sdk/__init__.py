"""The SDK a training script uses: ``trainhouse.init()`` returns a :class:`Run`.

Imports the standard library, httpx, orjson, numpy (optional) and torch only, never the server's
dependencies. The public modules are this one, :mod:`trainhouse.sdk.checkpoint` and
:mod:`trainhouse.sdk.data`; modules whose names start with an underscore are internal.
"""

from trainhouse.sdk._media import Histogram, Image, Table
from trainhouse.sdk._model import load_model
from trainhouse.sdk._run import Run, init
from trainhouse.sdk.checkpoint import Checkpointer, SaveHandle, load_checkpoint

__all__ = [
    "Checkpointer",
    "Histogram",
    "Image",
    "Run",
    "SaveHandle",
    "Table",
    "init",
    "load_checkpoint",
    "load_model",
]
