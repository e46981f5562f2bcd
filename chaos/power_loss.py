"""``power_loss``: the machine loses power at the Nth file event of a save; what was not durable
is gone when it comes back."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of, then
from pytest_reshard.chaos.file_event import at_file, matcher
from pytest_reshard.contract import FileKill
from pytest_reshard.schedule import Fault
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def power_loss(*, at_step: int, event: int | None = None, path: str | None = None,
               op: str | None = None, rank: int | None = 0, target: str | None = None,
               then_world_size: int | None = None, phase: str = "begin") -> Fault:
    """The machine loses power just before the ``event``-th file event the rank makes under the
    work folder from the fault point on (step ``at_step``, ``phase``: its start by default;
    counted as ``kill_at_file_event`` counts, or named as it names one: ``path=``, ``op=``):
    every rank dies at once, and the work folder comes back as POSIX allows after a crash:

    - each file written in the generation keeps only what an fsync made durable: the size of
      its last fsync, or, never synced, nothing (removed; left empty where a synced folder or
      rename names it); a file that was there before keeps its old size when opened to append,
      and is left empty when opened to truncate;
    - each rename whose destination folder was not fsynced after it is undone, the file it
      replaced back in place.

    ``crash_consistency`` then judges the resume as after a kill, and fails a save the workload
    recorded as complete before the cut that the power loss took away, naming the file that was
    not synced.

    Layer: the pessimistic end of what a crash of the page cache may leave (as ckpt-chaos's
    ``unsynced`` mode): real kernels write dirty pages back within seconds, and ext4 syncs a
    file renamed over another; a run that passes this is durable on any POSIX file system, one
    that fails may survive a real power cut on a lenient one. The undo is computed from the
    ranks' file events and applied to the work folder once every rank is dead. Not modelled:
    writes through raw descriptors or mmap (named as not judged), an unlink, rmtree or mkdir
    undone, a torn sector, the storage's own cache, and several nodes (one machine only).
    """
    return Fault("power_loss", target_of(rank, None, target, "one"), at_step, phase,
                 {**at_file(event, path, op), **then(then_world_size)})


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    p = fault["params"]
    run.watch_files().arm(p.get("event", 0), FileKill.POWER, power_off=run.power_off,
                          match=matcher(p))


def _requires(options: Mapping[str, Any]) -> str | None:
    if options.get("multi_node") or int(options.get("nodes", 1)) > 1:
        return ("power_loss cuts one machine, every rank on it: run it with a single-node "
                "launcher (fork, local or torchrun)")
    return None


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    """Early in a save's file events: the next save from the point on, wherever it falls."""
    from hypothesis import strategies as st

    return power_loss(at_step=ctx.step, phase=ctx.phase, event=draw(st.integers(1, 12)),
                      rank=draw(st.integers(0, ctx.world_size - 1)))


register(FaultKind("power_loss", execute=execute, ending=Ending.DEATH, watches_files=True,
                   loses_unsynced=True, requires=_requires, label="power loss", draw=_draw,
                   doc=power_loss.__doc__ or ""))
