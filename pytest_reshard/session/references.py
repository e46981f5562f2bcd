"""The clean reference runs a session compares chaos runs against: one per workload configuration
and topology, run once and reused (kept across sessions by ``refcache`` when asked), optionally
started beside the chaos run on the same warm fork server."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pytest_reshard import workloads
from pytest_reshard.history import History
from pytest_reshard.refcache import ReferenceCache, workload_files
from pytest_reshard.schedule import Schedule
from pytest_reshard.supervisor import launch
from pytest_reshard.supervisor.launch.fork import ForkLauncher
from pytest_reshard.supervisor.scenario import Scenario

__all__ = ["ReferenceRuns", "KILL_GRACE_S", "usable_cpus", "concurrent_reference_ok"]


#: Scenario settings a clean run does not use: judging thresholds (the chaos run's), the
#: throttle of device classes and the fault points of a schedule, both of which it runs without.
#: Its scenario has their defaults, so that scenarios differing only in them share one run.
UNUSED = ("throttle", "max_idle", "settle_steps", "max_stall_steps", "max_pause_steps", "min_throughput", "phases")
UNUSED_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Scenario) if f.name in UNUSED}


class ReferenceRuns:
    """The reference-run half of ``Session`` (a mixin: it runs its references through the
    session's ``execute`` and its shared fork launchers)."""

    artifacts: Path
    progress: Callable[[str], None]
    reference_cache: ReferenceCache | None
    concurrent_references: bool | None
    _pending: dict[str, "_Background"]
    _references: dict[str, History]
    _launchers: dict[tuple[str, ...], ForkLauncher]

    if TYPE_CHECKING:  # pragma: no cover - Session's, which this mixin calls
        def execute(self, scenario: Scenario, run_dir: Path, replay: str = "", name: str = "",
                    progress: Callable[[str], None] | None = None, live: bool = True,
                    launcher: Any = None) -> History: ...

        def shared_launcher(self, scenario: Scenario) -> ForkLauncher | None: ...

    def reference(self, scenario: Scenario, roles: Sequence[str]) -> History:
        """A fault-free run of the same workload, seed and data with these ranks' roles (cached).

        It runs under the scenario's own settings (hang and stall limits, memory budget) less
        the faults and device classes, so that what the chaos run is judged against ran as it
        did; every setting but the timeout, the launcher and those it does not use (``UNUSED``)
        keys the cache."""
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
        # a clean run computes what training should: at full speed, without device classes
        clean = dataclasses.replace(scenario, world_size=len(roles), roles=list(roles),
                                    schedule=Schedule(scenario.schedule.seed),
                                    args=list(scenario.args), launcher=on or scenario.launcher,
                                    devices=None, **UNUSED_DEFAULTS)
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
        assert fork is not None  # clean.launcher is the fork launcher (checked above)
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
