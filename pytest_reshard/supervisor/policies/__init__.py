"""What a generation does when its ranks die, fire planned faults or exit: one policy per mode.

The watch loop (``supervisor/watch.py``) polls, detects and dispatches; a ``GenerationPolicy``
decides. Three implementations, one module each:

- ``relaunch.py`` (``Relaunch``): the default; the generation ends and the next is launched.
- ``in_place.py`` (``InPlace``): wraps another policy; when every rank asks to reshard in place
  (``run.live_reshard``) the supervisor answers, and the generation ends once they handed over.
- ``membership.py`` (``Membership``): ``replica_groups=G``; a death restarts one replica group
  inside the running generation.

A policy sees the loop only through the ``Loop`` methods and attributes it is given at
``start``; it never writes the loop's state directly.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.schedule.kinds import FaultKind
    from pytest_reshard.supervisor.outcome import Outcome
    from pytest_reshard.supervisor.watch import Watch

__all__ = ["GenerationPolicy"]


class GenerationPolicy(Protocol):
    def start(self, loop: "Watch") -> None:
        """The generation's loop, before its first poll."""

    def on_fault(self, ev: dict[str, Any], declared: "FaultKind") -> bool:
        """A fault fired (first sight); True: the policy took it and the loop does nothing more."""

    def on_live(self, ev: dict[str, Any]) -> None:
        """A rank asks to reshard in place."""

    def poll(self) -> bool:
        """Each poll, before exits are judged; True: ranks were started (read exit codes again)."""

    def on_death(self, rank: int, code: int | None, normal: bool) -> bool:
        """A rank exited and nothing planned explains it; True: the policy handled it, and it is
        not the generation's failure."""

    def on_all_exited(self, codes: dict[int, int | None]) -> bool:
        """Every rank has exited; True: the generation is over."""

    def handed_over(self, codes: dict[int, int | None]) -> "Outcome | None":
        """Each poll: the outcome to end with while processes still run (a live reshard)."""

    def outcome(self, codes: dict[int, int | None]) -> "Outcome":
        """How the generation ended, once the loop stops."""
