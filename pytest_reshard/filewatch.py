"""``pytest_reshard.filewatch`` is ``pytest_reshard.rank.filewatch`` (one module under both names)."""
import sys
from typing import TYPE_CHECKING

from pytest_reshard.rank import filewatch as _module

sys.modules[__name__] = _module

if TYPE_CHECKING:  # the names, for type checkers, which do not follow sys.modules
    from pytest_reshard.rank.filewatch import *  # noqa: F403
