"""``preempt``: a spot preemption, SIGTERM then SIGKILL after a grace period."""
from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import positive, target_of
from pytest_reshard.contract import Cause, Env
from pytest_reshard.schedule import Fault
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def preempt(*, at_step: int, phase: str = "forward", rank: int | None = None,
            role: str | None = None, target: str | None = None, grace_s: float = 10.0,
            then_world_size: int | None = None) -> Fault:
    """Spot preemption: SIGTERM at the fault point, SIGKILL if still alive after ``grace_s``.

    Layer: a real SIGTERM delivered to the rank's process (the probe turns it into
    ``run.stop_requested()``); the supervisor enforces the grace period from outside. Under
    ``launcher="slurm"`` SLURM delivers it: ``scancel --signal=TERM`` of the job step when the
    fault fires (every process of the step on every node gets SIGTERM, torchrun's agents too, a
    few tens of ms after the point), then SIGKILL after the cluster's ``KillWait``, which is the
    grace there (``grace_s`` is not used). Must cost zero committed steps. Does not prove
    anything about a cloud provider's metadata-endpoint warning, SLURM's requeue of a preempted
    job, or a node that vanishes without SIGTERM (that is ``kill``).
    """
    params: dict = {"grace_s": positive("grace_s", grace_s)}
    if then_world_size is not None:
        params["then_world_size"] = int(then_world_size)
    return Fault("preempt", target_of(rank, role, target, "all"), at_step, phase, params)


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    if not os.environ.get(Env.SCHEDULER):  # else the scheduler signals the job (the launcher asks it)
        os.kill(os.getpid(), signal.SIGTERM)


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    return preempt(at_step=ctx.step, phase=ctx.phase, grace_s=ctx.notice_s)


register(FaultKind("preempt", execute=execute, ending=Ending.PLANNED, cause=Cause.PREEMPT,
                   deadline_param="grace_s", default_target="all", draw=_draw,
                   doc=preempt.__doc__ or ""))
