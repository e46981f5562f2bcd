"""What ``partition`` and ``slow_link`` share: one node's link, changed from inside its namespace.

A rank of a namespaced node (``launcher="elastic"``, ``supervisor/launch/netns.py``) lives in
its node's network namespace, so the commands it runs (``iptables``, ``tc``) change that node's
link alone; the other nodes and this machine's own network are untouched.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, Callable, Mapping

from pytest_reshard.contract import Env


def link_or_refuse(kind: str, tool: str) -> str:
    """This node's link (``GLOO_SOCKET_IFNAME``), refusing where there is no namespaced node."""
    from pytest_reshard.rank.probe import InjectedFault

    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if Env.NODE not in os.environ or ifname in ("", "lo") or shutil.which(tool) is None:
        raise InjectedFault(f"{kind} needs namespaced nodes (launcher='elastic' as root, "
                            f"network='netns' or 'auto') and {tool}: this rank's link is "
                            f"{ifname or 'unknown'}")
    return ifname


def apply(kind: str, commands: list[list[str]], undo: list[list[str]],
          duration_s: float | None) -> None:
    """Run ``commands`` in this node's namespace; after ``duration_s``, ``undo``, by a process
    of the node's own session that outlives its ranks."""
    from pytest_reshard.rank.probe import InjectedFault

    for cmd in commands:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        if done.returncode:
            raise InjectedFault(f"{kind}: `{' '.join(cmd)}` failed: {done.stderr.strip()}")
    if duration_s is not None:
        heal = "; ".join(" ".join(c) for c in undo)
        subprocess.Popen(["sh", "-c", f"sleep {duration_s}; {heal}"], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def needs_namespaced_nodes(kind: str) -> Callable[[Mapping[str, Any]], str | None]:
    """A ``requires`` for a kind that changes one node's link."""
    def requires(options: Mapping[str, Any]) -> str | None:
        if options.get("launcher") != "elastic" or int(options.get("nodes", 1)) < 2 or \
                options.get("network") == "loopback":
            return (f"{kind} acts on one node's link: it needs launcher='elastic' with "
                    "nodes >= 2 on namespaced nodes (network='netns' or 'auto', as root)")
        return None
    return requires
