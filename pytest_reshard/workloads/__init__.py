"""Workloads: what the harness runs, described once as a ``WorkloadSpec``.

A spec says how to start a rank, the roles of its ranks by default, the fault points it marks
beyond the standard phases, what the fork server imports before forking (so a relaunch does not
pay for ``import torch`` or a framework again), and which optional checkers it opts into. The
bundled workloads (``lm``, ``dflash``) register theirs in ``pytest_reshard.fixtures``; a
framework adapter or a user registers one the same way::

    from pytest_reshard.workloads import WorkloadSpec, register

    register(WorkloadSpec("my_trainer", script="train.py", phases=("eval",),
                          preload=("transformers",)))

A scenario names a workload by its registered name or by a script path; a script nobody
registered runs as ``python SCRIPT ARGS`` with one role and the standard phases.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["WorkloadSpec", "register", "unregister", "get", "registered", "resolve", "one_role", "WARMUP"]

#: Always preloaded by the fork server: torch, torch.distributed, DCP, FSDP.
WARMUP = "pytest_reshard.supervisor.launch.warmup"


def one_role(world_size: int) -> list[str]:
    """Every rank a ``trainer``."""
    return ["trainer"] * world_size


@dataclass(frozen=True)
class WorkloadSpec:
    """How to run one workload.

    - ``module`` (run as ``python -m module``) or ``script`` (a path): exactly one.
    - ``steps_arg``: the option that tells the workload the scenario's step count (``--steps``
      for the bundled ones); ``None``: it reads ``RESHARD_STEPS`` from the environment.
    - ``roles(world_size)``: each rank's role when the scenario names none.
    - ``phases``: fault points it marks with ``s.point()`` beyond ``STANDARD_PHASES``.
    - ``preload``: modules the fork server imports once (besides ``WARMUP``).
    - ``checks``: optional checkers that apply to it (e.g. ``sample_ledger`` for a pipeline).
    """

    name: str
    module: str | None = None
    script: str | None = None
    steps_arg: str | None = None
    roles: Callable[[int], list[str]] = one_role
    phases: tuple[str, ...] = ()
    preload: tuple[str, ...] = ()
    checks: frozenset[str] = field(default_factory=frozenset)
    doc: str = ""

    def __post_init__(self) -> None:
        if (self.module is None) == (self.script is None):
            raise ValueError(f"workload {self.name!r}: give module= or script=, exactly one")
        object.__setattr__(self, "phases", tuple(self.phases))
        object.__setattr__(self, "preload", tuple(self.preload))
        object.__setattr__(self, "checks", frozenset(self.checks))

    @classmethod
    def for_script(cls, path: str | Path) -> "WorkloadSpec":
        """A script nobody registered: one role, the standard phases."""
        return cls(name=str(path), script=str(path))

    def argv(self, steps: int, args: Sequence[str]) -> list[str]:
        """The rank's command line after the interpreter."""
        head = ["-m", self.module] if self.module else [str(Path(self.script or "").resolve())]
        return [*head, *([self.steps_arg, str(steps)] if self.steps_arg else []), *args]

    def preloads(self) -> list[str]:
        """What the fork server imports: the warm-up, then the spec's modules (and its own
        module, so the workload's imports are paid once)."""
        return list(dict.fromkeys([WARMUP, *self.preload, *([self.module] if self.module else [])]))


_SPECS: dict[str, WorkloadSpec] = {}


def register(spec: WorkloadSpec, *, replace: bool = False) -> WorkloadSpec:
    """Make ``spec`` runnable by name (``reshard_run(spec.name, ...)``). The same registration
    run again (a conftest imported twice: the same module or script) replaces itself."""
    old = _SPECS.get(spec.name)
    if old is not None and not replace and (old.module, old.script) != (spec.module, spec.script):
        raise ValueError(f"workload {spec.name!r} is already registered; pass replace=True to "
                         "redefine it")
    _SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Forget the spec registered under ``name`` (a test's own, say)."""
    _SPECS.pop(name, None)


#: The packages that register the bundled workloads (lm, dflash), loaded on the first lookup like
#: any plugin: they import this registry to register, so it names them instead of importing.
BUNDLED = ("pytest_reshard.fixtures",)


def _load_bundled() -> None:
    for module in BUNDLED:
        importlib.import_module(module)


def registered() -> list[str]:
    _load_bundled()
    return sorted(_SPECS)


def get(name: str) -> WorkloadSpec | None:
    """The spec registered under ``name``, or None."""
    _load_bundled()
    return _SPECS.get(name)


def resolve(workload: str) -> WorkloadSpec:
    """A registered name, or a script path (a registered spec whose ``script`` is that file
    wins); anything else is an error that lists the registered names."""
    spec = get(workload)
    if spec is not None:
        return spec
    path = Path(workload)
    if path.is_file():
        for known in _SPECS.values():
            if known.script and Path(known.script).resolve() == path.resolve():
                return known
        return WorkloadSpec.for_script(path)
    raise FileNotFoundError(
        f"workload {workload!r} is neither a registered workload ({', '.join(registered())}) "
        "nor an existing script path")
