"""``pytest_reshard.supervisor.procfs`` is ``pytest_reshard.procfs`` (one module under both names)."""
import sys

from pytest_reshard import procfs as _module

sys.modules[__name__] = _module
