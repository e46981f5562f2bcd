"""``rebalance``: a new shard placement at the same world size, with notice."""
from __future__ import annotations

from typing import Any

from pytest_reshard.chaos._common import positive
from pytest_reshard.chaos.shift_shards import execute
from pytest_reshard.contract import Cause
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register


def rebalance(*, fraction: float = 0.2, at_step: int, phase: str = "optimizer",
              notice_s: float = 10.0) -> Fault:
    """A new shard placement at the same world size, with notice (a scheduler's load balancing
    that moved 20% of the shards, each move forcing a checkpoint round trip).

    Layer: like ``shift_shards`` (notice, checkpoint, exit, relaunch), but the next generation
    keeps its size and ``fraction`` of the ranks (at least two) run on other devices:
    ``LOCAL_RANK`` and ``run.device_map`` say which. On a GPU runner every moved shard really
    lands on another GPU; on CPU only the processes change. Does not move live tensors.
    """
    if not 0 < fraction <= 1:
        raise ScheduleError(f"rebalance fraction must be in (0, 1], got {fraction}")
    return Fault("rebalance", "all", at_step, phase,
                 {"fraction": float(fraction), "notice_s": positive("notice_s", notice_s)})


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return rebalance(fraction=draw(st.sampled_from((0.5, 1.0))), at_step=ctx.step,
                     phase=ctx.phase, notice_s=ctx.notice_s)


register(FaultKind("rebalance", execute=execute, ending=Ending.PLANNED, cause=Cause.REBALANCE,
                   deadline_param="notice_s", relocates=True, default_target="all", draw=_draw,
                   min_world_size=2, doc=rebalance.__doc__ or ""))
