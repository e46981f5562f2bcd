"""``partition``: one node is cut off from the others; its packets are dropped, silently."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import positive, target_of
from pytest_reshard.chaos._link import apply, link_or_refuse, needs_namespaced_nodes
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import DrawContext, Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run

#: iptables chain and interface flag per direction, seen from the cut-off node
DIRECTIONS = {"both": (("INPUT", "-i"), ("OUTPUT", "-o")), "in": (("INPUT", "-i"),),
              "out": (("OUTPUT", "-o"),)}


def partition(*, rank: int, at_step: int, phase: str = "backward", direction: str = "both",
              duration_s: float | None = None) -> Fault:
    """At the fault point the node that hosts ``rank`` is cut off from the other nodes and the
    rendezvous: every packet its link receives (``direction="in"``), sends (``"out"``) or both
    is dropped, for ``duration_s`` seconds or to the end of the run (needs
    ``launcher="elastic"`` with ``nodes >= 2`` on namespaced nodes, as root).

    Layer: netfilter in the node's network namespace (``iptables ... -j DROP`` on its link):
    nothing is reset or refused, so TCP retransmits into the void and every peer waits, as
    behind a dead switch port. The job must notice within its own timeout (gloo's, NCCL's, or
    its own): once a rank fails, the supervisor fences the cut-off node (kills its agent and
    ranks, as a scheduler fences a node that stopped answering: only once the rank noted that
    its rules went in, and after a heal only until the job trains again), ``liveness`` names the victim
    partitioned, and torch's agents re-form the world on the nodes left. A job that does not
    notice within the scenario's ``stall_s`` hangs, and ``liveness`` fails it with the stuck
    stacks. A partition shorter than the job's timeout is a blip the job must ride out without
    a restart.

    Does not model a slow or lossy link (``slow_link``), a partition inside a node, or a split
    brain: the harness hosts the only rendezvous, so the cut-off side cannot form a world of
    its own, and the node never rejoins (the agents here only lose nodes).
    """
    if direction not in DIRECTIONS:
        raise ScheduleError(f"partition direction must be one of {sorted(DIRECTIONS)}, "
                            f"got {direction!r}")
    params: dict[str, Any] = {"direction": direction}
    if duration_s is not None:
        params["duration_s"] = positive("duration_s", duration_s)
    return Fault("partition", target_of(rank, None, None, "one"), at_step, phase, params)


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    p = fault["params"]
    ifname = link_or_refuse("partition", "iptables")
    rules = [[chain, flag, ifname, "-j", "DROP"] for chain, flag in DIRECTIONS[p["direction"]]]
    apply(run, fault, [(["iptables", "-I", *r], ["iptables", "-D", *r]) for r in rules])


def _draw(draw: Any, ctx: DrawContext) -> Fault:
    from hypothesis import strategies as st

    return partition(rank=draw(st.integers(0, ctx.world_size - 1)), at_step=ctx.step,
                     phase=ctx.phase, direction=draw(st.sampled_from(sorted(DIRECTIONS))))


register(FaultKind("partition", execute=execute, ending=Ending.DEATH, draw=_draw,
                   min_world_size=2, requires=needs_namespaced_nodes("partition"), isolates=True,
                   doc=partition.__doc__ or ""))
