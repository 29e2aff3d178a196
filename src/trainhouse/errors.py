"""The public path of :mod:`trainhouse.core.errors` (what scripts and users import)."""

from trainhouse.core.errors import *  # noqa: F403
from trainhouse.core.errors import __all__ as __all__
