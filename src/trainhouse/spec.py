"""The public path of :mod:`trainhouse.core.spec` (what scripts and users import)."""

from trainhouse.core.spec import *  # noqa: F403
from trainhouse.core.spec import __all__ as __all__
