"""``slow_rank``: a straggler."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import positive, target_of
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def slow_rank(*, at_step: int, delay_ms: float, steps: int = 1, phase: str = "forward",
              rank: int | None = None, role: str | None = None,
              target: str | None = None) -> Fault:
    """A straggler: the target sleeps ``delay_ms`` at the point, for ``steps`` consecutive steps.

    Layer: wall-clock delay in the rank's own thread, so its peers wait in the next collective
    and the per-rank timings in the history show who was slow. Does not model a slow link or
    thermal throttling (the delay is not in the collective itself).
    """
    if int(steps) < 1:
        raise ScheduleError(f"slow_rank steps must be >= 1, got {steps}")
    return Fault("slow_rank", target_of(rank, role, target, "one"), at_step, phase,
                 {"delay_ms": positive("delay_ms", delay_ms), "steps": int(steps)})


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    params = fault["params"]
    time.sleep(float(params["delay_ms"]) / 1000)
    left = int(params.get("steps", 1)) - 1
    if left > 0:  # the straggler stays slow: the same point of the next step, silently
        run.repeat_fault(fault, step=fault["step"] + 1, params={**params, "steps": left})


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return slow_rank(rank=draw(st.integers(0, ctx.world_size - 1)), at_step=ctx.step,
                     phase=ctx.phase, delay_ms=float(draw(st.integers(1, 50))),
                     steps=draw(st.integers(1, 2)))


register(FaultKind("slow_rank", execute=execute, draw=_draw, doc=slow_rank.__doc__ or ""))
