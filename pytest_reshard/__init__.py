"""pytest-reshard: prove that distributed PyTorch training survives resharding.

The public API is small: ``chaos`` (fault injectors), ``probe`` (the calls a training script
makes), the ``reshard_run`` fixture (from the pytest plugin), and for use outside pytest
``Session`` / ``scenario_from`` (run scenarios) with ``Result`` and ``Verdict``.
Nothing here imports torch until a scenario runs.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["chaos", "probe", "Session", "scenario_from", "Result", "ReshardAssertionError",
           "Verdict"]
_MODULES = {"chaos": "chaos", "probe": "rank.probe", "strategies": "schedule.strategies",
            "telemetry": "rank.telemetry"}
_LAZY = {"Session": "session", "scenario_from": "session", "Result": "result",
         "ReshardAssertionError": "result", "Verdict": "verdict"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{_MODULES[name]}")
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
