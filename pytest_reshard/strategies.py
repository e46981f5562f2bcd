"""``pytest_reshard.strategies`` is ``pytest_reshard.schedule.strategies`` (one module under both
names), so ``from pytest_reshard.strategies import schedules`` works."""
import sys

from pytest_reshard.schedule import strategies as _module

sys.modules[__name__] = _module
