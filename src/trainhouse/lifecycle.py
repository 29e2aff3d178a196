"""The public path of :mod:`trainhouse.core.lifecycle` (what scripts and users import)."""

from trainhouse.core.lifecycle import *  # noqa: F403
from trainhouse.core.lifecycle import __all__ as __all__
