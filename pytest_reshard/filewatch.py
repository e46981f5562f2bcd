"""``pytest_reshard.filewatch`` is ``pytest_reshard.rank.filewatch`` (one module under both names)."""
import sys

from pytest_reshard.rank import filewatch as _module

sys.modules[__name__] = _module
