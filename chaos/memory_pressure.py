"""``memory_pressure``: the rank holds more memory from the point on."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def memory_pressure(*, at_step: int, bytes: int, phase: str = "begin", rank: int | None = None,
                    role: str | None = None, target: str | None = None) -> Fault:
    """Hold ``bytes`` more on the target from the point on, as a dependency upgrade that grows
    every rank's footprint does: the ranks with the least headroom die first, often silently.
    CUDA memory when the rank uses a GPU, else resident host memory.

    With ``memory_budget_bytes`` set on the scenario, the supervisor ends a rank whose peak RSS
    passes the budget (as the OOM killer would) and the verdict names the rank and phase; the
    ``memory_headroom`` check flags ranks that come within a margin of it. On CPU it proves the
    accounting and the loud failure, not CUDA allocator fragmentation.
    """
    if int(bytes) <= 0:
        raise ScheduleError(f"memory_pressure bytes must be > 0, got {bytes}")
    return Fault("memory_pressure", target_of(rank, role, target, "one"), at_step, phase,
                 {"bytes": int(bytes)})


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    """Hold ``bytes`` more for the rest of the generation: CUDA memory when the rank uses a GPU,
    else resident host memory (every page written, so it really counts in RSS)."""
    size = int(fault["params"]["bytes"])
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        run.hold(torch.empty(size, dtype=torch.uint8, device="cuda"))
        return
    ballast = bytearray(size)
    ballast[::4096] = b"\x01" * len(range(0, size, 4096))
    run.hold(ballast)


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return memory_pressure(rank=draw(st.integers(0, ctx.world_size - 1)), at_step=ctx.step,
                           phase=ctx.phase, bytes=draw(st.integers(1, 16)) << 20)


register(FaultKind("memory_pressure", execute=execute, draw=_draw,
                   doc=memory_pressure.__doc__ or ""))
