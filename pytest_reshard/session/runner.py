"""The runner: a session runs scenarios end to end (supervisor -> history -> checkers -> Result)
and owns what outlives one scenario: the warm fork servers (one per set of preloaded modules),
the reference runs (``references``) and the artifacts folder's lock (``artifacts``)."""
from __future__ import annotations

import dataclasses
import shlex
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from pytest_reshard import checkers, workloads
from pytest_reshard.contract import RunDir
from pytest_reshard.history import History
from pytest_reshard.refcache import ReferenceCache
from pytest_reshard.result import Result
from pytest_reshard.session.artifacts import OWNER_FILE, _Lock, lock_artifacts, run_dir_of
from pytest_reshard.session.references import ReferenceRuns, _Background
from pytest_reshard.supervisor.launch.fork import ForkLauncher
from pytest_reshard.supervisor.outcome import HarnessError
from pytest_reshard.supervisor.run import Supervisor
from pytest_reshard.supervisor.scenario import Scenario
from pytest_reshard.supervisor.watch import Status
from pytest_reshard.verdict import Verdict

__all__ = ["Session"]


class Session(ReferenceRuns):
    """Shared state of many scenarios: launchers and the reference-run cache. Close it.

    A session holds a lock on its artifacts folder while it is open: two sessions writing one
    folder would delete and overwrite each other's histories."""

    def __init__(self, artifacts: Path, *, progress: Callable[[str], None] | None = None,
                 status: Callable[[Status], None] | None = None,
                 reference_cache: Path | None = None,
                 concurrent_references: bool | None = None) -> None:
        """``reference_cache``: a folder that keeps clean reference runs across sessions
        (``refcache.py`` says what keys them and when an entry is invalid); None: per session.
        ``concurrent_references``: run a scenario's clean reference run (at its first topology)
        at the same time as the scenario, on the same warm fork server; None: when the machine
        has the cores (``concurrent_reference_ok``), else one after the other."""
        self.artifacts = Path(artifacts)
        self.reference_cache = ReferenceCache(reference_cache) if reference_cache else None
        self.concurrent_references = concurrent_references
        self._pending: dict[str, _Background] = {}  # reference key -> its run in the background
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
        if key not in self._launchers or self._launchers[key].closed:
            self._launchers[key] = ForkLauncher(preload)
        return self._launchers[key]

    def close(self) -> None:
        self._cancel_pending()
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
    def execute(self, scenario: Scenario, run_dir: Path, replay: str = "", name: str = "",
                progress: Callable[[str], None] | None = None, live: bool = True,
                launcher: Any = None) -> History:
        """Run the scenario's processes into ``run_dir`` and load the recorded history
        (``progress``: where its lines go, the session's by default; ``live``: report its
        status as it runs; ``launcher``: this one rather than the shared fork launcher)."""
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        (run_dir / OWNER_FILE).write_text(name or run_dir.name)
        if launcher is None and (launcher := self.shared_launcher(scenario)) is not None:
            # Warm it on this thread before the scenario's clock starts: a cold server's
            # imports (3 s quiet, over 10 s at load 7) are the harness's, not the ranks' start.
            launcher.start()
        sup = Supervisor(scenario, run_dir, progress=progress or self.progress, launcher=launcher)
        if self.status is not None and live:
            status = self.status
            shown = (name or run_dir.name).split("::")[-1]
            sup.on_status = lambda st: status(dataclasses.replace(st, name=shown))
        sup.run(replay=replay)
        history = History.load(run_dir)
        if history.damaged:   # not judged: no verdict, not even an unknown that allow_unknown passes
            d = history.damaged[0]
            raise HarnessError(f"pytest-reshard: not judged: the run's history is damaged at "
                               f"{d.file}:{d.line}: {d.why}" + (f" (and {len(history.damaged) - 1} "
                               "more lines)" if len(history.damaged) > 1 else "") + "; an event "
                               "file changed after the harness wrote it (a failing disk, another "
                               "process writing into the run folder); run it again")
        return history

    def run(self, scenario: Scenario, name: str, *, replay: str = "") -> Result:
        run_dir = self.run_dir_of(name)
        replay = replay or f"pytest-reshard replay {shlex.quote(str(RunDir(run_dir).scenario))}"
        started = time.monotonic()
        self._start_reference(scenario)
        failed = True
        try:
            history = self.execute(scenario, run_dir, replay=replay, name=name)
            verdicts = self.check(scenario, history)
            for name_, v in verdicts.items():
                verdicts[name_] = dataclasses.replace(v, replay=replay)
            result = Result(name=name, scenario=scenario, run_dir=run_dir, history=history,
                            verdicts=verdicts, wall_s=time.monotonic() - started, replay=replay)
            result.save()
            result.report = self.write_report(result)
            failed = False
        finally:
            self._settle_pending(failed)
        return result

    def run_dir_of(self, name: str) -> Path:
        """The folder of the scenario called ``name`` (``artifacts.run_dir_of``)."""
        return run_dir_of(self.artifacts, name)

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
