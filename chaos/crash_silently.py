"""``crash_silently``: the rank vanishes with exit code 0 and no word."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of, then
from pytest_reshard.schedule import Fault
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def crash_silently(*, at_step: int, phase: str = "backward", rank: int | None = None,
                   role: str | None = None, target: str | None = None,
                   then_world_size: int | None = None) -> Fault:
    """The target vanishes with exit code 0 and no traceback: a death that no error path sees,
    so only the supervisor can notice it.

    Layer: ``os._exit(0)`` at the point, so no exception handler, atexit hook or probe ``exit``
    event runs. The supervisor must notice a rank that left early without a planned event.
    Does not reproduce a CUDA driver killing the process from outside.
    """
    return Fault("crash_silently", target_of(rank, role, target, "one"), at_step, phase,
                 then(then_world_size))


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    os._exit(0)  # no traceback, no exit event, exit code 0


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return crash_silently(rank=draw(st.integers(0, ctx.world_size - 1)), at_step=ctx.step,
                          phase=ctx.phase)


register(FaultKind("crash_silently", execute=execute, ending=Ending.DEATH, draw=_draw,
                   min_world_size=2, doc=crash_silently.__doc__ or ""))
