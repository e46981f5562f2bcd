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
from pytest_reshard.supervisor.policies.membership import check_scenario as check_membership
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
        sup = Supervisor(scenario, run_dir, progress=progress or self.progress,
                         launcher=launcher or self.shared_launcher(scenario))
        if self.status is not None and live:
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
        key, clean, shape = self._clean(scenario, roles)
        if key not in self._references:
            if key in self._pending:  # started with the chaos run: wait for it (bounded)
                self._references[key] = self._take(key)
            else:
                self._references[key] = self._run_reference(scenario.workload, roles, key, clean,
                                                            shape, self.progress, live=True)
        return self._references[key]

    def _clean(self, scenario: Scenario, roles: Sequence[str]) -> tuple[str, Scenario, dict]:
        """The key, the clean scenario and the shape (what keys it) of a reference run."""
        on = launch.launcher_class(scenario.launcher).references_on  # elastic: no agents needed
        clean = dataclasses.replace(scenario, world_size=len(roles), roles=list(roles),
                                    schedule=Schedule(scenario.schedule.seed),
                                    args=list(scenario.args), launcher=on or scenario.launcher)
        shape = {k: v for k, v in clean.to_dict().items() if k not in ("timeout_s", "launcher")}
        key = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
        return key, clean, shape

    def _run_reference(self, workload: str, roles: Sequence[str], key: str, clean: Scenario,
                       shape: dict, progress: Callable[[str], None], live: bool,
                       launcher: Any = None) -> History:
        name = f"reference ({_topology(roles)})"
        if self.reference_cache is None:
            progress(f"reference run: {workload}, {_topology(roles)}")
            return self.execute(clean, self.artifacts / "_references" / key, name=name,
                                progress=progress, live=live, launcher=launcher)
        argv = workloads.resolve(clean.workload).argv(clean.steps, clean.args)
        lasting = self.reference_cache.key(shape, workload_files(argv))

        def run(folder: Path) -> History:
            progress(f"reference run: {workload}, {_topology(roles)} "
                     f"(kept in the reference cache as {lasting})")
            return self.execute(clean, folder, name=name, progress=progress, live=live,
                                launcher=launcher)

        return self.reference_cache.get_or_run(lasting, run)

    # -- the reference run beside the chaos run --------------------------------------------
    def _start_reference(self, scenario: Scenario) -> None:
        """Start the scenario's clean run at its first topology in the background, when allowed
        (``concurrent_references``) and not had already. Only on the fork launcher: closing the
        shared server ends the run's ranks at once, whatever happens to the scenario."""
        roles = scenario.initial_roles()
        key, clean, shape = self._clean(scenario, roles)
        if key in self._references or key in self._pending or clean.launcher != ForkLauncher.name:
            return
        allowed = self.concurrent_references
        if allowed is None:
            allowed = concurrent_reference_ok(scenario.world_size, clean.world_size)
        if not allowed:
            return
        # Started here, on this thread (a server dies with the thread that started it), and lent
        # to the background run, which never starts one: once it is closed, that run fails at
        # its next launch.
        fork = self.shared_launcher(clean)
        fork.start()
        borrowed = fork.borrowed()
        self._pending[key] = _Background(
            lambda say: self._run_reference(scenario.workload, roles, key, clean, shape, say,
                                            live=False, launcher=borrowed), self.progress,
            timeout=clean.timeout_s + KILL_GRACE_S)

    def _take(self, key: str) -> History:
        """The result of the reference run in the background under ``key``; one that overruns
        its timeout is ended (its fork server closed) and raises."""
        pending = self._pending.pop(key)
        try:
            return pending.result()
        except TimeoutError:
            self._pending[key] = pending
            self._cancel_pending()
            raise

    def _settle_pending(self, failed: bool) -> None:
        """After a scenario: a reference run started with it and not asked for (a run that never
        started asks for none) is waited for and kept, so that nothing runs between two
        scenarios; after an exception (an interrupt) it is ended instead."""
        if failed:
            self._cancel_pending()
            return
        for key in list(self._pending):
            try:
                self._references[key] = self._take(key)
            except Exception:  # noqa: BLE001 - asked for again by a later scenario, it runs then
                pass

    def _cancel_pending(self) -> None:
        """End every reference run in the background: close the fork servers they use (their
        ranks die with them at once) and wait, bounded, for their threads."""
        if not self._pending:
            return
        pending, self._pending = list(self._pending.values()), {}
        for launcher in self._launchers.values():
            launcher.close()
        for p in pending:
            p.join(KILL_GRACE_S)

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


#: Seconds a reference run in the background may take beyond its own timeout to hand back.
KILL_GRACE_S = 60.0


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; ``os.cpu_count()`` elsewhere)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def concurrent_reference_ok(chaos_world_size: int, reference_world_size: int) -> bool:
    """The rule for running a reference beside its chaos run by default: at least two CPUs per
    rank of the two runs together. Below that the two runs would share cores, and a run
    slowed by its neighbour is one whose loss, heartbeats and deadlines tell less."""
    return usable_cpus() >= 2 * (chaos_world_size + reference_world_size)


class _Background:
    """A reference run on a thread of its own. Its progress lines are kept and said, in order,
    by the thread that takes its result, so the session's output stays one writer's."""

    def __init__(self, work: Callable[[Callable[[str], None]], History],
                 progress: Callable[[str], None], timeout: float = 0.0) -> None:
        import threading

        self._said: list[str] = []
        self._progress = progress
        self._value: History | None = None
        self._error: BaseException | None = None
        self.timeout = timeout
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True,
                                        name="pytest-reshard reference")
        self._thread.start()

    def _run(self, work: Callable[[Callable[[str], None]], History]) -> None:
        try:
            self._value = work(self._said.append)
        except BaseException as e:  # noqa: BLE001 - handed to whoever takes the result
            self._error = e

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def result(self) -> History:
        self._thread.join(self.timeout)
        for line in self._said:
            self._progress(line)
        self._said.clear()
        if self._thread.is_alive():
            raise TimeoutError(f"the clean reference run started with the scenario did not "
                               f"end within {self.timeout:.0f} s")
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


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
    multi_node = bool(options.get("launcher")) and launch.facts(options["launcher"])["multi_node"]
    if multi_node and (nodes < 1 or world_size % nodes):
        raise ValueError(f"launcher={options['launcher']!r}: world_size {world_size} must split "
                         f"evenly into nodes={nodes} (each node runs world_size / nodes ranks)")


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
    facts = launch.facts(options["launcher"]) if options.get("launcher") else {}
    validate(schedule, world_size=world_size, steps=steps, phases=options.get("phases") or (),
             options={**facts, **options})  # a kind's requires() reads the launcher's facts
    scenario = Scenario(workload=workload, world_size=world_size, steps=steps, schedule=schedule,
                        **options)
    check_membership(scenario)
    return scenario

