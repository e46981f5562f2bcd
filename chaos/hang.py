"""``hang``: a rank that neither dies nor works."""
from __future__ import annotations

import enum
import os
import signal
import threading
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of, then
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


class HangMode(str, enum.Enum):
    """How the rank hangs (``hang(mode=...)`` takes the value or the member)."""

    SIGSTOP = "sigstop"   # the process is stopped: heartbeat silent, the kernel says T
    BLOCK = "block"       # the main thread blocks; the process and its heartbeat live on


def hang(*, at_step: int, phase: str = "backward", rank: int | None = None,
         role: str | None = None, target: str | None = None, mode: str = HangMode.SIGSTOP,
         then_world_size: int | None = None) -> Fault:
    """A rank that neither dies nor works, from the fault point on.

    - ``mode="sigstop"``: a real SIGSTOP. Its heartbeat stops and the kernel reports it stopped,
      so the supervisor names it within ``hang_s`` (default 1 s) instead of waiting for gloo's
      30-minute timeout.
    - ``mode="block"``: the rank's main thread blocks inside the phase while the process and its
      heartbeat stay alive, as a rank wedged in a collective kernel does; its peers block in their
      next collective. Nothing beats the clock here: the supervisor sees a *stall* after
      ``stall_s`` (default 10 s) without progress from any rank.

    Either way the supervisor then SIGKILLs the hung rank only, as a scheduler's health check
    would; its peers fail their next collective and get ``failure_grace_s`` to save what they
    hold before the generation ends, and the next starts at ``then_world_size`` (default the
    same size). Does not reproduce a GPU kernel spinning on the device.
    """
    try:
        mode = HangMode(mode)
    except ValueError:
        raise ScheduleError(f"hang mode must be 'sigstop' or 'block', got {mode!r}") from None
    return Fault("hang", target_of(rank, role, target, "one"), at_step, phase,
                 {"mode": mode.value, **then(then_world_size)})


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    if fault["params"].get("mode") == HangMode.BLOCK:
        threading.Event().wait()  # wedged in the phase, heartbeat still beating
    os.kill(os.getpid(), signal.SIGSTOP)


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return hang(rank=draw(st.integers(0, ctx.world_size - 1)), at_step=ctx.step, phase=ctx.phase)


register(FaultKind("hang", execute=execute, ending=Ending.HANG, draw=_draw, min_world_size=2,
                   doc=hang.__doc__ or ""))
