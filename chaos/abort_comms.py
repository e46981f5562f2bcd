"""``abort_comms``: the rank's process group is aborted in place; the process lives on."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of, then
from pytest_reshard.schedule import Fault
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def abort_comms(*, at_step: int, phase: str = "backward", rank: int | None = None,
                target: str | None = None, then_world_size: int | None = None) -> Fault:
    """Abort the rank's communicators at the fault point and leave the process running, as a
    NIC flap or NCCL's watchdog does: torch's ``_abort_process_group`` tears down every group
    of the rank (gloo closes its pairs; NCCL aborts its communicators). The peers' collectives
    fail at once ("Connection closed by peer"); the rank's own next collective raises. The job
    must notice and fail loudly or recover (re-form the group, or exit for a relaunch); one that
    swallows the error trains on alone, and one that waits forever is a hang.

    Layer: the communicator, from inside the rank: the process, its memory and its files are
    untouched. Does not drop packets (a partition) or delay them (a slow link), and on gloo it is
    torch's abort, not a driver's.
    """
    return Fault("abort_comms", target_of(rank, None, target, "one"), at_step, phase,
                 then(then_world_size))


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    from torch.distributed import distributed_c10d

    from pytest_reshard.rank.probe import FaultNotInjected

    abort = getattr(distributed_c10d, "_abort_process_group", None)
    if abort is None:
        raise FaultNotInjected("abort_comms needs torch.distributed's _abort_process_group "
                               "(torch 2.5 or later)")
    if not distributed_c10d.is_initialized():
        raise FaultNotInjected("abort_comms: this rank has no process group to abort")
    abort()


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return abort_comms(rank=draw(st.integers(0, ctx.world_size - 1)), at_step=ctx.step,
                       phase=ctx.phase)


register(FaultKind("abort_comms", execute=execute, ending=Ending.DEATH, draw=_draw,
                   min_world_size=2, label="comms abort", doc=abort_comms.__doc__ or ""))
