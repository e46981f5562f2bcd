"""The supervisor owns one scenario: it runs generations of ranks until the run completes or fails.

- ``scenario.py``: the Scenario (plain data) and the roles of its ranks;
- ``run.py``: the Supervisor, which writes each generation's fault plan, launches the ranks and
  records what it saw to ``events/supervisor.jsonl``;
- ``watch.py``: the poll loop of one generation (exits, heartbeats, progress, deadlines), which
  dispatches to the generation's policy (``policies/``: relaunch, in place, membership);
- ``outcome.py``: how a generation ends (``Outcome``, ``PendingEnd``); ``detect.py``: what the
  loop notices about single ranks;
- ``tail.py``: the incremental reader of the ranks' events;
- ``procfs.py``: what /proc says about a process;
- ``launch/``: one module per launcher behind one protocol.

Names are imported on first use, so that ``procfs`` and ``launch`` load without the rest.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Scenario", "Supervisor", "Outcome", "default_roles", "expand_roles", "next_roles",
           "rebalanced", "HarnessError"]
_WHERE = {"Scenario": "scenario", "default_roles": "scenario", "expand_roles": "scenario",
          "next_roles": "scenario", "Supervisor": "run", "rebalanced": "outcome", "Outcome": "outcome",
          "HarnessError": "outcome"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
