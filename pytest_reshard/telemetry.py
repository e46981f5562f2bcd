"""``pytest_reshard.telemetry`` is ``pytest_reshard.rank.telemetry`` (one module under both names)."""
import sys

from pytest_reshard.rank import telemetry as _module

sys.modules[__name__] = _module
