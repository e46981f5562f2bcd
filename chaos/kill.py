"""``kill`` and ``kill_during_save``: a real SIGKILL at the fault point."""
from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of, then
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def kill(*, at_step: int, phase: str = "backward", rank: int | None = None,
         role: str | None = None, target: str | None = None,
         then_world_size: int | None = None) -> Fault:
    """SIGKILL the target at the fault point: an unplanned loss (a node dies, an ECC drain).

    Layer: a real SIGKILL, raised by the rank itself at the point so the timing is exact; peers
    see the dead connection exactly as in production. The next generation starts at
    ``then_world_size`` (default: the same size, a replacement node). Proves that the workload
    resumes within its declared rewind budget; it does not exercise a network partition or a
    half-written file system (the kernel still flushes what the rank wrote).
    """
    return Fault("kill", target_of(rank, role, target, "one"), at_step, phase, then(then_world_size))


def kill_during_save(*, at_step: int, boundary: str = "commit", rank: int | None = None,
                     target: str | None = None) -> Fault:
    """SIGKILL a rank inside a checkpoint save: at its start (``boundary="start"``, phase
    ``checkpoint``) or after the shards are written but before the save is committed
    (``boundary="commit"``, phase ``checkpoint_commit``). ``at_step`` must be a step that saves.

    Layer: a real SIGKILL while the files of a save exist half-way; proves the resume takes the
    newest *complete* checkpoint. Needs a workload that marks those phases: ``s.point(...)``
    inside the step's ``with`` block, or ``run.point("checkpoint", step=step)`` for a save after
    it (the bundled LM does). Does not tear a single file at the byte level (the kernel keeps
    what was written).
    """
    phases = {"start": "checkpoint", "commit": "checkpoint_commit"}
    if boundary not in phases:
        raise ScheduleError(f"kill_during_save boundary must be 'start' or 'commit', got {boundary!r}")
    return Fault("kill", target_of(rank, None, target, "one"), at_step, phases[boundary], {})


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return kill(rank=draw(st.integers(0, ctx.world_size - 1)), at_step=ctx.step, phase=ctx.phase)


register(FaultKind("kill", execute=execute, ending=Ending.DEATH, draw=_draw, min_world_size=2,
                   doc=kill.__doc__ or ""))
