"""The public path of :mod:`trainhouse.client.frames` (what scripts and users import)."""

from trainhouse.client.frames import *  # noqa: F403
from trainhouse.client.frames import __all__ as __all__
