"""``shift_shards`` and ``drain``: planned reshards to a new world size, with notice."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import positive
from pytest_reshard.contract import Cause
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def shift_shards(*, to_world_size: int | None = None, at_step: int, phase: str = "optimizer",
                 notice_s: float = 10.0, roles: Mapping[str, int] | None = None) -> Fault:
    """A planned reshard to ``to_world_size`` with ``notice_s`` of advance notice.

    ``roles`` (e.g. ``{"target": 3, "drafter": 1}``) also moves ranks between roles: a planned
    topology change such as a pipeline's 5 targets + 3 drafters -> 6 + 2 after drafters died
    (the world size then defaults to the sum). Without it the ranks keep their roles, trimmed at
    the end.

    Layer: the scheduler's notice reaches every rank at the fault point
    (``run.reshard_requested()``); the workload must checkpoint and exit before the deadline,
    after which the supervisor kills it; the next generation runs at the new world size (and
    roles: ``run.roles``) and the workload's own load path reshards. Must cost zero committed
    steps. A workload may instead reshard in place (``run.live_reshard``): its surviving
    processes become the next generation, the leavers exit, the harness starts only the
    joiners, and the same checks judge the in-memory handover. Does not model a scheduler's
    own resize protocol or its failures.
    """
    params: dict = {"notice_s": positive("notice_s", notice_s)}
    if roles is not None:
        counts = {str(k): int(v) for k, v in dict(roles).items()}
        if not counts or any(v < 0 for v in counts.values()) or sum(counts.values()) < 1:
            raise ScheduleError(f"roles must map role names to rank counts (>= 0, at least one "
                                f"rank in all), got {roles!r}")
        total = sum(counts.values())
        if to_world_size is not None and int(to_world_size) != total:
            raise ScheduleError(f"roles {counts} name {total} ranks but to_world_size is "
                                f"{to_world_size}; make them agree (or leave to_world_size out)")
        params["roles"] = {k: v for k, v in counts.items() if v}
        to_world_size = total
    if to_world_size is None:
        raise ScheduleError("shift_shards needs to_world_size= (or roles=)")
    if int(to_world_size) < 1:
        raise ScheduleError(f"to_world_size must be >= 1, got {to_world_size}")
    params["to_world_size"] = int(to_world_size)
    return Fault("shift_shards", "all", at_step, phase, params)


def drain(*, world_size: int, at_step: int, fraction: float = 0.5, waves: int = 2,
          every: int = 2, notice_s: float = 30.0) -> list[Fault]:
    """A maintenance window: drain ``fraction`` of ``world_size`` ranks in ``waves`` planned
    reshards, ``every`` steps apart, each with ``notice_s`` of notice: a maintenance window that
    shrinks the world in steps, each a full save and resharded load.

    Returns several faults; pass them in ``faults=`` as they are (nested lists are flattened).
    Layer: that of ``shift_shards``, repeated: each wave is a full save, exit and resharded load.
    """
    if not 0 < fraction < 1:
        raise ScheduleError(f"drain fraction must be between 0 and 1, got {fraction}")
    drained = max(1, round(world_size * fraction))
    if int(waves) < 1 or waves > drained:
        raise ScheduleError(f"drain waves must be between 1 and {drained} (ranks drained)")
    sizes, left = [], world_size
    for wave in range(waves):
        left -= drained // waves + (1 if wave < drained % waves else 0)
        sizes.append(left)
    return [shift_shards(to_world_size=size, at_step=at_step + i * every, notice_s=notice_s)
            for i, size in enumerate(sizes)]


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    """The notice: ``run.reshard_requested()`` returns it from now on (a rebalance keeps the size)."""
    from pytest_reshard.rank.probe import ReshardNotice

    params = fault["params"]
    size = int(params.get("to_world_size", run.world_size))
    run.notify_reshard(ReshardNotice(size, time.time() + float(params["notice_s"]), fault["kind"]))


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return shift_shards(to_world_size=draw(st.sampled_from(list(ctx.world_sizes))),
                        at_step=ctx.step, phase=ctx.phase, notice_s=ctx.notice_s)


register(FaultKind("shift_shards", execute=execute, ending=Ending.PLANNED, cause=Cause.RESHARD,
                   deadline_param="notice_s", default_target="all", draw=_draw,
                   doc=shift_shards.__doc__ or ""))
