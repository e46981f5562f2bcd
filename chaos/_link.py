"""What ``partition`` and ``slow_link`` share: one node's link, changed from inside its namespace.

A rank of a namespaced node (``launcher="elastic"``, ``supervisor/launch/netns.py``) lives in
its node's network namespace, so the commands it runs (``iptables``, ``tc``) change that node's
link alone; the other nodes and this machine's own network are untouched.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import TYPE_CHECKING, Any, Callable, Mapping

from pytest_reshard.contract import LINK_CHANGED, Env, Ev

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run

#: One change of the link: the command that makes it, and the one that takes it back.
Change = tuple[list[str], list[str]]


def link_or_refuse(kind: str, tool: str) -> str:
    """This node's link (``GLOO_SOCKET_IFNAME``), refusing where there is no namespaced node."""
    from pytest_reshard.rank.probe import FaultNotInjected

    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if Env.NODE not in os.environ or ifname in ("", "lo") or shutil.which(tool) is None:
        raise FaultNotInjected(f"{kind} needs namespaced nodes (launcher='elastic' as root, "
                               f"network='netns' or 'auto') and {tool}: this rank's link is "
                               f"{ifname or 'unknown'}")
    return ifname


def apply(run: Run, fault: Mapping[str, Any], changes: list[Change]) -> None:
    """Make ``changes`` in this node's namespace, all or none (a command that fails takes back
    the ones before it), then say so (``LINK_CHANGED``): the supervisor acts on that note, never
    on the fault's firing alone. With ``duration_s`` a process of the node's namespace takes
    them back later; the namespace's teardown kills it if the run ends first."""
    from pytest_reshard.rank.probe import FaultNotInjected

    done: list[Change] = []
    for change in changes:
        ran = subprocess.run(change[0], capture_output=True, text=True, timeout=10)
        if ran.returncode:
            for _, undo in reversed(done):
                subprocess.run(undo, capture_output=True, timeout=10)
            raise FaultNotInjected(f"{fault['kind']}: `{' '.join(change[0])}` failed: "
                                   f"{ran.stderr.strip().rstrip('.')}")
        done.append(change)
    duration_s = fault["params"].get("duration_s")
    if duration_s is not None:
        heal = "; ".join(" ".join(undo) for _, undo in reversed(changes))
        subprocess.Popen(["sh", "-c", f"sleep {duration_s}; {heal}"], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run.emit(Ev.NOTE, what=LINK_CHANGED, fault_id=fault["id"], node=int(os.environ[Env.NODE]),
             duration_s=duration_s)


def needs_namespaced_nodes(kind: str) -> Callable[[Mapping[str, Any]], str | None]:
    """A ``requires`` for a kind that changes one node's link."""
    def requires(options: Mapping[str, Any]) -> str | None:
        if options.get("launcher") != "elastic" or int(options.get("nodes", 1)) < 2 or \
                options.get("network") == "loopback":
            return (f"{kind} acts on one node's link: it needs launcher='elastic' with "
                    "nodes >= 2 on namespaced nodes (network='netns' or 'auto', as root)")
        return None
    return requires
