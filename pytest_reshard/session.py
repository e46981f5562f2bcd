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

from pytest_reshard.contract import RunDir
from pytest_reshard.history import History
from pytest_reshard.supervisor.watch import Status
from pytest_reshard.refcache import ReferenceCache, workload_files
from pytest_reshard.result import Result
from pytest_reshard.verdict import Verdict
from pytest_reshard.schedule import Fault, Schedule, kinds, validate
from pytest_reshard.supervisor import launch
from pytest_reshard.supervisor.launch.fork import ForkLauncher
from pytest_reshard.supervisor.run import Supervisor
from pytest_reshard.supervisor.scenario import Scenario, expand_roles
from pytest_reshard import checkers, workloads


class ArtifactsInUse(RuntimeError):
    """Another session writes to the same artifacts folder; the message says which and what to do."""


class Session:
    """Shared state of many scenarios: launchers and the reference-run cache. Close it.

    A session holds a lock on its artifacts folder while it is open: two sessions writing one
    folder would delete and overwrite each other's histories."""

    def __init__(self, artifacts: Path, *, progress: Callable[[str], None] | None = None,
                 status: Callable[[Status], None] | None = None,
                 reference_cache: Path | None = None) -> None:
        """``reference_cache``: a folder that keeps clean reference runs across sessions
        (``refcache.py`` says what keys them and when an entry is invalid); None: per session."""
        self.artifacts = Path(artifacts)
        self.reference_cache = ReferenceCache(reference_cache) if reference_cache else None
        self._lock: _Lock | None = lock_artifacts(self.artifacts)
        self.progress = progress or (lambda msg: None)
        self.status = status            # live progress of the scenario being run, if wanted
        self.png_skipped: str | None = None  # why reports have no PNG plots (None: they have)
        self._launchers: dict[tuple[str, ...], ForkLauncher] = {}
        self._references: dict[str, History] = {}

    def shared_launcher(self, scenario: Scenario) -> ForkLauncher | None:
        """The warm fork server for this workload's preloads; other launchers are per run."""
        if scenario.launcher != ForkLauncher.name:
            return None
        preload = workloads.resolve(scenario.workload).preloads()
        key = tuple(preload)
        if key not in self._launchers:
            self._launchers[key] = ForkLauncher(preload)
        return self._launchers[key]

    def close(self) -> None:
        for launcher in self._launchers.values():
            launcher.close()
        self._launchers.clear()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

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
        (run_dir / OWNER_FILE).write_text(name or run_dir.name)
        sup = Supervisor(scenario, run_dir, progress=self.progress,
                         launcher=self.shared_launcher(scenario))
        if self.status is not None:
            status = self.status
            shown = (name or run_dir.name).split("::")[-1]
            sup.on_status = lambda st: status(dataclasses.replace(st, name=shown))
        sup.run(replay=replay)
        return History.load(run_dir)

    def reference(self, scenario: Scenario, roles: Sequence[str]) -> History:
        """A fault-free run of the same workload, seed and data with these ranks' roles (cached).

        It runs under the scenario's own settings (hang and stall limits, memory budget, phases)
        less the faults, so that what the chaos run is judged against ran as it did; every
        setting but the timeout and the launcher keys the cache."""
        on = launch.launcher_class(scenario.launcher).references_on  # elastic: no agents needed
        clean = dataclasses.replace(scenario, world_size=len(roles), roles=list(roles),
                                    schedule=Schedule(scenario.schedule.seed),
                                    args=list(scenario.args), launcher=on or scenario.launcher)
        shape = {k: v for k, v in clean.to_dict().items() if k not in ("timeout_s", "launcher")}
        key = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
        if key not in self._references:
            name = f"reference ({_topology(roles)})"
            if self.reference_cache is None:
                self.progress(f"reference run: {scenario.workload}, {_topology(roles)}")
                self._references[key] = self.execute(clean, self.artifacts / "_references" / key,
                                                     name=name)
            else:
                argv = workloads.resolve(clean.workload).argv(clean.steps, clean.args)
                lasting = self.reference_cache.key(shape, workload_files(argv))

                def run(folder: Path) -> History:
                    self.progress(f"reference run: {scenario.workload}, {_topology(roles)} "
                                  f"(kept in the reference cache as {lasting})")
                    return self.execute(clean, folder, name=name)

                self._references[key] = self.reference_cache.get_or_run(lasting, run)
        return self._references[key]

    def run(self, scenario: Scenario, name: str, *, replay: str = "") -> Result:
        run_dir = self.run_dir_of(name)
        replay = replay or f"pytest-reshard replay {shlex.quote(str(RunDir(run_dir).scenario))}"
        started = time.monotonic()
        history = self.execute(scenario, run_dir, replay=replay, name=name)
        verdicts = self.check(scenario, history)
        for name_, v in verdicts.items():
            verdicts[name_] = dataclasses.replace(v, replay=replay)
        result = Result(name=name, scenario=scenario, run_dir=run_dir, history=history,
                        verdicts=verdicts, wall_s=time.monotonic() - started, replay=replay)
        result.save()
        result.report = self.write_report(result)
        return result

    def run_dir_of(self, name: str) -> Path:
        """The folder of the scenario called ``name`` (a test's node id): its name made safe for
        a file system, with a short hash of ``name`` when that lost information (``x+y`` and
        ``x_y``) or the folder belongs to another name, so two tests never share one."""
        safe = _safe(name)
        tagged = f"{safe[:110]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        if len(safe) > 120 or any(not (c.isalnum() or c in _KEPT) for c in name):
            return self.artifacts / tagged
        owner = self.artifacts / safe / OWNER_FILE
        if owner.exists() and owner.read_text() != name:
            return self.artifacts / tagged
        return self.artifacts / safe

    def write_report(self, result: Result) -> Path | None:
        """``report.html`` (and PNG plots) beside the history. A report that cannot be drawn is
        a warning, not a lost verdict."""
        from pytest_reshard.reports import html as html_report

        history = result.history
        began = any(history.begun(g) for g in history.generations)
        # the clean run the checkers already made (cached); none for a run that never started
        reference = self.reference(result.scenario, result.scenario.initial_roles()) \
            if began else None
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
                                    opted_in=workloads.resolve(scenario.workload).checks)
        return checkers.run_all(ctx)


def _topology(roles: Sequence[str]) -> str:
    """``2 target + 2 drafter`` or ``world size 4``."""
    counts = dict(Counter(roles))
    if len(counts) == 1:
        return f"world size {len(roles)}"
    return " + ".join(f"{n} {role}" for role, n in counts.items())


#: Each run folder names the scenario that wrote it, so no other one ever reuses (deletes) it.
OWNER_FILE = "name.txt"
#: Characters of a node id that stand for themselves in a folder name, or as "_" ("/", ":", "[",
#: "]") without two node ids of one test file meeting (a hash separates them if they do).
_KEPT = "-_./:[]"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


_LOCKS: dict[Path, list[Any]] = {}  # folder -> [open lock file, holders in this process]


class _Lock:
    """One holder of a folder's lock; the lock is per process (re-entrant within it)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def close(self) -> None:
        held = _LOCKS.get(self.folder)
        if held is not None:
            held[1] -= 1
            if held[1] == 0:
                held[0].close()  # releases the flock
                del _LOCKS[self.folder]


def lock_artifacts(folder: Path) -> _Lock:
    """Hold ``folder`` (created if missing) for this process: another process that asks for it
    gets ``ArtifactsInUse`` naming the holder. Close the returned handle to let go."""
    import fcntl
    import os

    folder = Path(folder).resolve()
    held = _LOCKS.get(folder)
    if held is None:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".reshard-lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ArtifactsInUse(f"the artifacts folder {folder} is in use by {holder}; wait for "
                                 "it to finish, or give this run its own folder "
                                 "(--reshard-artifacts=OTHER)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"the pytest-reshard session of pid {os.getpid()}\n")
        handle.flush()
        held = _LOCKS[folder] = [handle, 0]
    held[1] += 1
    return _Lock(folder)


def _check_nodes(world_size: int, options: dict[str, Any]) -> None:
    """Multi-node settings that cannot work, rejected before any agent starts."""
    nodes = int(options.get("nodes", 1))
    if options.get("launcher") == "elastic" and (nodes < 1 or world_size % nodes):
        raise ValueError(f"launcher='elastic': world_size {world_size} must split evenly into "
                         f"nodes={nodes} (each node runs world_size / nodes ranks)")


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
    # A kind that fires at a file event needs them recorded, in the clean reference run too.
    options["files"] = bool(options.get("files")) or any(kinds.get(f.kind).watches_files
                                                         for f in flat)
    if options.get("roles") is not None:
        options["roles"] = expand_roles(options["roles"], world_size)
    spec = workloads.get(workload)
    if not options.get("phases") and spec is not None and spec.phases:
        options["phases"] = list(spec.phases)
    if options.get("launcher"):
        launch.launcher_class(options["launcher"])  # an unknown one: the error lists them
    _check_nodes(world_size, options)
    validate(schedule, world_size=world_size, steps=steps, phases=options.get("phases") or (),
             options=options)
    return Scenario(workload=workload, world_size=world_size, steps=steps, schedule=schedule,
                    **options)

