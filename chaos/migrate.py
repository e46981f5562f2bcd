"""``migrate``: one rank's shard moves to a new process while the others keep training."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import positive
from pytest_reshard.contract import Cause
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def migrate(rank: int, *, at_step: int, phase: str = "optimizer", notice_s: float = 30.0) -> Fault:
    """A planned move of ``rank``'s shard to a new process (a new device), with ``notice_s`` of
    notice to finish it: the world keeps its size and every other rank its process.

    Layer: the notice reaches every rank at the fault point (``run.reshard_requested()``, whose
    ``moves`` names the rank). A workload that migrates in place asks ``run.live_reshard``: the
    harness starts the joiner at once, as rank ``rank`` of the next generation, and keeps the
    other processes; the workload copies the shard over while it trains on (the bundled LM with
    ``--live``: a shadow kept in sync, swapped in at a step boundary), the old process leaves.
    ``state_equivalence`` compares the state before and after the swap and ``downtime`` how long
    training paused. A workload that does not migrate saves and exits, and the next generation
    (same size) is a relaunch. Does not model a scheduler's own migration protocol, nor a move
    across machines (the joiner runs where the harness runs its ranks).
    """
    if int(rank) < 0:
        raise ScheduleError(f"migrate needs a rank >= 0, got {rank}")
    return Fault("migrate", "all", at_step, phase,
                 {"rank": int(rank), "notice_s": positive("notice_s", notice_s)})


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    """The notice, naming the rank that moves."""
    from pytest_reshard.rank.probe import FaultNotInjected, ReshardNotice

    params = fault["params"]
    if int(params["rank"]) >= run.world_size:
        raise FaultNotInjected(f"migrate: rank {params['rank']} is not a rank of this world of "
                               f"{run.world_size}; name one below it")
    run.notify_reshard(ReshardNotice(run.world_size, time.time() + float(params["notice_s"]),
                                     fault["kind"], moves=int(params["rank"])))


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return migrate(draw(st.integers(0, ctx.world_size - 1)), at_step=ctx.step, phase=ctx.phase,
                   notice_s=ctx.notice_s)


register(FaultKind("migrate", execute=execute, ending=Ending.PLANNED, cause=Cause.RESHARD,
                   deadline_param="notice_s", replaces=True, default_target="all", draw=_draw,
                   doc=migrate.__doc__ or ""))
