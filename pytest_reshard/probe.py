"""``pytest_reshard.probe`` is ``pytest_reshard.rank.probe`` (one module under both names)."""
import sys

from pytest_reshard.rank import probe as _module

sys.modules[__name__] = _module
