"""``pytest_reshard.probe`` is ``pytest_reshard.rank.probe`` (one module under both names)."""
import sys
from typing import TYPE_CHECKING

from pytest_reshard.rank import probe as _module

sys.modules[__name__] = _module

if TYPE_CHECKING:  # the names, for type checkers, which do not follow sys.modules
    from pytest_reshard.rank.probe import *  # noqa: F403
