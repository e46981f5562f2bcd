"""``pytest_reshard.strategies`` is ``pytest_reshard.schedule.strategies`` (one module under both
names), so ``from pytest_reshard.strategies import schedules`` works."""
import sys
from typing import TYPE_CHECKING

from pytest_reshard.schedule import strategies as _module

sys.modules[__name__] = _module

if TYPE_CHECKING:  # the names, for type checkers, which do not follow sys.modules
    from pytest_reshard.schedule.strategies import *  # noqa: F403
