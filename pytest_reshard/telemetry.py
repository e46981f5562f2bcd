"""``pytest_reshard.telemetry`` is ``pytest_reshard.rank.telemetry`` (one module under both names)."""
import sys
from typing import TYPE_CHECKING

from pytest_reshard.rank import telemetry as _module

sys.modules[__name__] = _module

if TYPE_CHECKING:  # the names, for type checkers, which do not follow sys.modules
    from pytest_reshard.rank.telemetry import *  # noqa: F403
