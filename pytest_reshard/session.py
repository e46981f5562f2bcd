"""Run a scenario end to end: supervisor -> history -> checkers -> Result.

The runner also owns what outlives one scenario inside a session: the warm fork servers (one per
set of preloaded modules) and the clean reference runs that loss continuity compares against
(one per workload configuration and world size, run once and reused).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import shutil
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from pytest_reshard.history import History
from pytest_reshard.reports.progress import Status
from pytest_reshard.result import Result
from pytest_reshard.verdict import Verdict
from pytest_reshard.schedule import Fault, Schedule, validate
from pytest_reshard.supervisor.launch import ForkLauncher
from pytest_reshard.supervisor import BUNDLED_PHASES, Scenario, Supervisor, default_roles, expand_roles, workload_argv
from pytest_reshard import checkers


class Session:
    """Shared state of many scenarios: launchers and the reference-run cache. Close it."""

    def __init__(self, artifacts: Path, *, progress: Callable[[str], None] | None = None,
                 status: Callable[[Status], None] | None = None) -> None:
        self.artifacts = Path(artifacts)
        self.progress = progress or (lambda msg: None)
        self.status = status            # live progress of the scenario being run, if wanted
        self.png_skipped: str | None = None  # why reports have no PNG plots (None: they have)
        self._launchers: dict[tuple[str, ...], ForkLauncher] = {}
        self._references: dict[str, History] = {}

    def shared_launcher(self, scenario: Scenario) -> ForkLauncher | None:
        """The warm fork server for this workload's preloads; other launchers are per run."""
        if scenario.launcher != "fork":
            return None
        _, preload = workload_argv(scenario)
        key = tuple(preload)
        if key not in self._launchers:
            self._launchers[key] = ForkLauncher(preload)
        return self._launchers[key]

    def close(self) -> None:
        for launcher in self._launchers.values():
            launcher.close()
        self._launchers.clear()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- running ---------------------------------------------------------------------------
    def execute(self, scenario: Scenario, run_dir: Path, replay: str = "", name: str = "") -> History:
        """Run the scenario's processes into ``run_dir`` and load the recorded history."""
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        sup = Supervisor(scenario, run_dir, progress=self.progress,
                         launcher=self.shared_launcher(scenario))
        if self.status is not None:
            status = self.status
            sup.on_status = lambda st: status(dataclasses.replace(st, name=name or run_dir.name))
        sup.run(replay=replay)
        return History.load(run_dir)

    def reference(self, scenario: Scenario, roles: Sequence[str]) -> History:
        """A fault-free run of the same workload, seed and data with these ranks' roles (cached).

        Only what shapes the loss keys the cache; chaos knobs (memory budget, hang and stall
        limits) are left at their defaults, so a budget meant for the faulty run cannot end the
        clean one."""
        clean = Scenario(workload=scenario.workload, world_size=len(roles), steps=scenario.steps,
                         schedule=Schedule(scenario.schedule.seed), args=list(scenario.args),
                         timeout_s=scenario.timeout_s, backend=scenario.backend,
                         # a clean run needs no agents: elastic scenarios compare with fork runs
                         launcher="fork" if scenario.launcher == "elastic" else scenario.launcher,
                         roles=list(roles))
        shape = {k: v for k, v in clean.to_dict().items() if k not in ("timeout_s", "launcher")}
        key = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
        if key not in self._references:
            self.progress(f"reference run: {scenario.workload}, {_topology(roles)}")
            self._references[key] = self.execute(clean, self.artifacts / "_references" / key,
                                                 name=f"reference ({_topology(roles)})")
        return self._references[key]

    def run(self, scenario: Scenario, name: str, *, replay: str = "") -> Result:
        run_dir = self.artifacts / _safe(name)
        replay = replay or f"pytest-reshard replay {shlex.quote(str(run_dir / 'scenario.json'))}"
        started = time.monotonic()
        history = self.execute(scenario, run_dir, replay=replay, name=name.split("::")[-1])
        verdicts = self.check(scenario, history)
        for name_, v in verdicts.items():
            verdicts[name_] = dataclasses.replace(v, replay=replay)
        result = Result(name=name, scenario=scenario, run_dir=run_dir, history=history,
                        verdicts=verdicts, wall_s=time.monotonic() - started, replay=replay)
        result.save()
        result.report = self.write_report(result)
        return result

    def write_report(self, result: Result) -> Path | None:
        """``report.html`` (and PNG plots) beside the history. A report that cannot be drawn is
        a warning, not a lost verdict."""
        from pytest_reshard.reports import html as html_report

        reference = self.reference(result.scenario, initial_roles(result.scenario))  # cached
        try:
            written = html_report.write(result, reference)
        except Exception as e:  # noqa: BLE001 - reported, the verdict stands
            warnings.warn(f"pytest-reshard: could not write the HTML report of {result.name} into "
                          f"{result.run_dir}: {type(e).__name__}: {e}", stacklevel=2)
            return None
        self.png_skipped = written.png_skipped
        return written.page

    def check(self, scenario: Scenario, history: History) -> dict[str, Verdict]:
        """Every registered checker that applies to this run, by name (``checkers.registry``).

        Checkers that need clean runs get them through the context from ``reference`` (run
        once per configuration and topology, cached); one that raises is an ``unknown`` verdict
        naming it and the exception, and one that does not apply is absent."""
        ctx = checkers.CheckContext(history, scenario,
                                    reference_runs=lambda roles: self.reference(scenario, roles),
                                    opted_in=frozenset())
        return checkers.run_all(ctx)


def initial_roles(scenario: Scenario) -> list[str]:
    return expand_roles(scenario.roles, scenario.world_size) if scenario.roles else \
        default_roles(scenario.workload, scenario.world_size)


def _topology(roles: Sequence[str]) -> str:
    """``2 target + 2 drafter`` or ``world size 4``."""
    counts = dict(Counter(roles))
    if len(counts) == 1:
        return f"world size {len(roles)}"
    return " + ".join(f"{n} {role}" for role, n in counts.items())


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]


def _check_nodes(schedule: Schedule, world_size: int, options: dict[str, Any]) -> None:
    """Multi-node settings that cannot work, rejected before any agent starts."""
    nodes = int(options.get("nodes", 1))
    if options.get("launcher") == "elastic" and (nodes < 1 or world_size % nodes):
        raise ValueError(f"launcher='elastic': world_size {world_size} must split evenly into "
                         f"nodes={nodes} (each node runs world_size / nodes ranks)")
    if any(f.kind == "kill_node" for f in schedule.faults) and \
            (options.get("launcher") != "elastic" or nodes < 2):
        raise ValueError("kill_node needs launcher='elastic' and nodes >= 2: a node is one "
                         "torchrun agent, and one must survive")


def scenario_from(workload: str, *, world_size: int, steps: int, faults: Sequence[Fault] = (),
                  seed: int = 0, **options: Any) -> Scenario:
    """Build a Scenario, rejecting bad input with messages that say what to change."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    flat: list[Fault] = []
    for f in faults:  # injectors such as chaos.drain return several faults
        for one in (f if isinstance(f, (list, tuple)) else [f]):
            if not isinstance(one, Fault):
                raise TypeError(f"faults must be built with pytest_reshard.chaos, got {one!r}")
            flat.append(one)
    schedule = Schedule(seed, flat)
    if options.get("roles") is not None:
        options["roles"] = expand_roles(options["roles"], world_size)
    if not options.get("phases") and workload in BUNDLED_PHASES:
        options["phases"] = list(BUNDLED_PHASES[workload])
    validate(schedule, world_size=world_size, steps=steps, phases=options.get("phases") or ())
    _check_nodes(schedule, world_size, options)
    return Scenario(workload=workload, world_size=world_size, steps=steps, schedule=schedule,
                    **options)

