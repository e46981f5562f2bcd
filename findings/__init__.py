"""The record: real upstream bugs the harness finds, each a folder that reproduces it.

An entry's folder holds
- ``finding.py``: ``FINDING = Finding(...)``: what broke, where it is reported, the versions
  with the bug and the fix, and the scenario that shows it with the checker that must fail;
- ``train.py``: a user's training script run under the harness; with ``--fixed`` it takes the
  fixed path (the fixed release's code, or the workaround the report settled on);
- ``reproduce.py``: the bug without the harness: prints what went wrong and exits 1, or exits
  0 with ``--fixed``.

``tests/scenarios/test_findings.py`` runs every entry both ways, and its reproduction.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Finding:
    title: str
    upstream: str            # where it is reported: "pytorch/pytorch#140900"; "unreported: owner/repo"
    #                          (and the closest report) when nobody has reported it
    affected: str            # the versions that have it
    fixed: str               # the version or patch that fixes it; "open" when nothing does
    reproduced_with: str     # "the real library: torch 2.13.0", or the mechanism and why
    checker: str             # the checker that fails on the bug
    message: str             # words that checker's message holds
    faults: Callable[[], list[Any]]   # the scenario's faults (chaos.*)
    world_size: int = 2
    steps: int = 8
    args: tuple[str, ...] = ()        # the script's arguments, both ways
    fixed_args: tuple[str, ...] = ("--fixed",)
    notes: str = ""          # what the harness needed, what it does not prove
    slug: str = field(default="", compare=False)

    @property
    def folder(self) -> Path:
        return HERE / self.slug


def catalog() -> dict[str, Finding]:
    """slug -> its Finding, from every entry folder's ``finding.py``."""
    found = {}
    for module in sorted(HERE.glob("*/finding.py")):
        spec = importlib.util.spec_from_file_location(f"findings.{module.parent.name}", module)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        finding: Finding = loaded.FINDING
        found[module.parent.name] = Finding(**{**finding.__dict__, "slug": module.parent.name})
    return found
