"""``kill_node``: a whole node (its torchrun agent and every rank on it) dies at once."""
from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of
from pytest_reshard.contract import Env
from pytest_reshard.schedule import Fault
from pytest_reshard.schedule.kinds import Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run


def kill_node(*, rank: int, at_step: int, phase: str = "backward") -> Fault:
    """The node that hosts ``rank`` dies at the fault point: its torchrun agent and every rank
    on it, at once (needs ``launcher="elastic"`` or ``"slurm"``, with ``nodes >= 2``).

    Layer: real SIGKILLs of the agent and its workers, raised by the rank itself so the timing is
    exact. Under ``elastic`` the surviving agents see their workers fail, meet again at the c10d
    rendezvous without the dead node and restart the workers at the smaller world size, all
    torch's own elastic machinery. Under ``slurm`` the node's step task dies (SLURM reports it
    killed); the node is lost for the rest of the run and the next job step runs on the nodes
    left. Either way the workload must reshard on load within its rewind budget. Does not prove
    a silent partition (packets dropped, no connection reset), a node rejoining, or SLURM's own
    handling of a node that stops answering (slurmd keeps running).
    """
    return Fault("kill_node", target_of(rank, None, None, "one"), at_step, phase, {})


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    """The agent (this rank's parent), every worker it started, then this rank."""
    from pytest_reshard import procfs
    from pytest_reshard.rank.probe import FaultNotInjected

    if Env.NODE not in os.environ:
        raise FaultNotInjected("kill_node needs ranks under a node's agent "
                               "(launcher='elastic' or 'slurm')")
    agent = os.getppid()
    for pid in (agent, *(p for p in procfs.children(agent) if p != os.getpid())):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _requires(options: Mapping[str, Any]) -> str | None:
    """``multi_node`` is the launcher's own fact (``supervisor.launch.facts``), which
    ``scenario_from`` passes along with the scenario's options."""
    if not options.get("multi_node") or int(options.get("nodes", 1)) < 2:
        return ("kill_node needs launcher='elastic' or 'slurm' (a launcher that spans several "
                "nodes) and nodes >= 2: a node is one torchrun agent, and one must survive")
    return None


register(FaultKind("kill_node", execute=execute, ending=Ending.DEATH, requires=_requires,
                   doc=kill_node.__doc__ or ""))
