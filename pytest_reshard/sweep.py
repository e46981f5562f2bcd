"""A crash at every file event of one save: record the save once, then one scenario per event.

    @pytest.mark.reshard(workload="train.py", world_size=2, steps=8)
    @pytest.mark.reshard_sweep(save_step=4, rank=0)     # default: the second save, rank 0
    def test_save_survives_any_crash(reshard_run, file_point):
        file_point.judge(reshard_run(faults=[file_point.fault()]))

At collection a clean run of the marker's scenario records every file event of its ranks
(``pytest_reshard.filewatch``), once per session: pytest-xdist's workers share one recording
through a lock. ``file_point`` is parametrized with one ``FilePoint`` per file event of that
save on that rank (a SIGKILL before it) and one more per ``write`` (the file torn at half its
bytes), and with ``flip=True`` one per data file with a byte flipped after it was written
(which some checker must catch: ``FilePoint.judge``); each runs as its own test, so ``-n`` and
``--reshard-shard`` split the sweep, and each is judged by every checker (``crash_consistency``
among them). The terminal shows the matrix (event x mode x verdict) and the smallest failing
point's replay command; ``sweep.html`` and ``sweep.json`` in the artifacts folder keep it.

The events of a save are those its rank makes from the start of the save's step to the start of
the next step, and later writes under a folder that save created (an async save's tail).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from pytest_reshard.contract import MUTATIONS, FileKill, FileOp
from pytest_reshard.history import Begun, FileEvent, file_trail
from pytest_reshard.reports.sweep import masked

__all__ = ["FilePoint", "points", "save_steps", "record", "parametrize"]


@dataclass(frozen=True)
class FilePoint:
    """One crash point: kill ``rank`` at its ``event``-th file event from the start of ``step``."""

    step: int
    event: int
    op: str
    path: str
    mode: str = FileKill.BEFORE      # a FileKill
    rank: int = 0
    tear_bytes: int | None = None

    @property
    def id(self) -> str:
        """A test id that is the same in every session (random parts of names masked)."""
        return f"s{self.step}-e{self.event:02d}-{self.mode}-{self.op}-" \
               f"{masked(os.path.basename(self.path) or self.path)}"

    def fault(self) -> Any:
        from pytest_reshard import chaos

        if self.mode == FileKill.POWER:
            return chaos.power_loss(at_step=self.step, event=self.event, rank=self.rank)
        return chaos.kill_at_file_event(at_step=self.step, event=self.event, mode=self.mode,
                                        rank=self.rank, tear_bytes=self.tear_bytes)

    def describe(self) -> str:
        how = {FileKill.TORN: f"killed torn at {self.tear_bytes} bytes of",
               FileKill.FLIP: "had a byte flipped after",
               FileKill.POWER: "lost power before"}.get(FileKill(self.mode), "killed before")
        return f"rank {self.rank} {how} `{self.op} {self.path}` (event {self.event} of " \
               f"step {self.step})"

    def judge(self, result: Any) -> None:
        """Assert what this point must show: a crash (before, torn) passes every checker; a
        flipped byte must be caught by some checker (the resume read corrupted state). First,
        that the kill hit the event the recording named (else the point tested something else:
        an async save's thread orders its events differently from run to run)."""
        hit = next((e for e in result.history.file_events()        # the armed event
                    if e.killed or e.flip is True), None)
        if hit is None:
            raise AssertionError(f"{self.describe()}: the kill never fired: the rank made fewer "
                                 f"than {self.event} file events from the start of step "
                                 f"{self.step} (the recorded save had more)")
        if hit.op != self.op or masked(hit.path) != masked(self.path):
            raise AssertionError(f"{self.describe()}: the kill hit `{hit.op} {hit.path}` "
                                 "instead, so this point did not test what it names: the save's "
                                 "file events are not in the same order in every run (an async "
                                 "save's thread?)")
        if self.mode != FileKill.FLIP:
            result.assert_ok()
        elif result.ok:
            raise AssertionError(f"{self.describe()}: the next generation resumed from the "
                                 "corrupted checkpoint and no checker noticed")


def save_steps(events: Sequence[Any], rank: int) -> list[int]:
    """The steps in whose window ``rank`` changed files: the saves, as the files show them.
    ``events``: rank events, raw or as ``History`` records."""
    return sorted({e.at_step for e in _files(events) if e.rank == rank
                   and e.op in MUTATIONS and e.at_step is not None})


def _files(events: Sequence[Any]) -> list[FileEvent]:
    return [e for e in file_trail(events) if isinstance(e, FileEvent)]


#: Removals after the save's step are a later save's cleanup, not this save's tail.
REMOVALS = (FileOp.UNLINK, FileOp.RMDIR, FileOp.RMTREE)
#: A flip point is made for each file of the save at least this big (its data, not a pointer).
FLIP_MIN_BYTES = 64


def points(events: Sequence[Any], *, rank: int = 0,
           save_step: int | None = None, flip: bool = False, power: bool = False
           ) -> list[FilePoint]:
    """Every crash point of one save, from a clean run's events in order (one generation);
    with ``flip``, one more per data file closed (a byte flipped after it is written); with
    ``power``, one more per event (a power loss before it: ``power_loss``)."""
    trail = file_trail(events, begins=True)
    saves = save_steps(trail, rank)
    if not saves:
        others = sorted({e.rank for e in _files(trail) if e.op in MUTATIONS
                         and e.at_step is not None})
        raise ValueError(f"the clean run made no file event on rank {rank} under the work "
                         "folder" + (f"; rank(s) {', '.join(map(str, others))} did: sweep one "
                                     f"of them (reshard_sweep(rank={others[0]}))" if others else
                                     ": does the workload write its checkpoints under "
                                     "run.workdir (the harness's work folder)?"))
    step = save_step if save_step is not None else saves[min(1, len(saves) - 1)]
    if step not in saves:
        raise ValueError(f"save_step={step}: rank {rank} wrote no file in step {step}; it "
                         f"saved in steps {', '.join(map(str, saves))}")
    mine = [e for e in trail if e.rank == rank]
    start = next(i for i, e in enumerate(mine) if isinstance(e, Begun) and e.step == step)
    made: list[str] = []             # folders the save created
    out: list[FilePoint] = []
    later = [e for e in mine[start:] if isinstance(e, FileEvent) and e.op in MUTATIONS]
    for n, e in enumerate(later, 1):   # n: the count the kill fires at
        op, path = str(e.op), e.path
        ours = e.at_step == step or (e.op not in REMOVALS and any(
            path == d or path.startswith(d + "/") for d in made))   # an async save's tail
        if not ours:
            continue
        if e.op == FileOp.MKDIR and e.at_step == step:
            made.append(path)
        if e.op == FileOp.RENAME and any(path == d for d in made):
            made.append(e.dst)
        out.append(FilePoint(step, n, op, path, FileKill.BEFORE, rank))
        if power:
            out.append(FilePoint(step, n, op, path, FileKill.POWER, rank))
        if e.op == FileOp.WRITE:
            end = next((x.written for x in later[n:]
                        if x.path == path and x.op in (FileOp.FSYNC, FileOp.CLOSE)), None)
            start_at = int(e.offset or 0)
            if end is not None and end - start_at >= 2:
                out.append(FilePoint(step, n, op, path, FileKill.TORN, rank, (start_at + end) // 2))
        if e.op == FileOp.CLOSE and flip and int(e.size or 0) >= FLIP_MIN_BYTES:
            out.append(FilePoint(step, n, op, path, FileKill.FLIP, rank))
    return out


# -- at collection -----------------------------------------------------------------------------
def parametrize(metafunc: Any, state: Any) -> None:
    """``pytest_generate_tests`` for a test that asks for ``file_point``."""
    import pytest

    from pytest_reshard.refcache import marker_options, resolve_workload, workload_files
    from pytest_reshard.session import scenario_from
    from pytest_reshard.workloads import resolve

    where = metafunc.definition.nodeid
    opts = marker_options(metafunc.definition, "reshard")
    workload = opts.pop("workload", None)
    if workload is None:
        raise pytest.UsageError(f"{where}: file_point needs the scenario it sweeps: "
                                "@pytest.mark.reshard(workload=..., world_size=..., steps=...)")
    sweep_opts = marker_options(metafunc.definition, "reshard_sweep")
    rank, save_step = int(sweep_opts.pop("rank", 0)), sweep_opts.pop("save_step", None)
    flip = bool(sweep_opts.pop("flip", False))
    power = bool(sweep_opts.pop("power", False))
    if sweep_opts:
        raise pytest.UsageError(f"{where}: reshard_sweep takes save_step=, rank=, flip= and power=, "
                                f"not {', '.join(sweep_opts)}")
    s = state.settings
    workload = resolve_workload(workload, Path(metafunc.definition.path))
    seed, timeout = opts.pop("seed", None), opts.pop("timeout", None)
    scenario = scenario_from(
        workload, world_size=int(opts.pop("world_size", 4)), steps=int(opts.pop("steps", 20)),
        seed=int(s["reshard_seed"] if seed is None else seed), files=True,
        timeout_s=float(timeout or s["reshard_timeout"]),
        launcher=opts.pop("launcher", None) or s["reshard_launcher"],
        backend=_backend(opts.pop("backend", None) or s["reshard_backend"], where),
        args=[str(a) for a in opts.pop("args", ())], **opts)
    if not 0 <= rank < scenario.world_size:
        raise pytest.UsageError(f"{where}: reshard_sweep rank={rank} is not a rank of world "
                                f"size {scenario.world_size}")
    run = getattr(metafunc.config, "workerinput", {}).get("testrunuid") or _SESSION
    key = hashlib.sha256(json.dumps([scenario.to_dict(), run, rank, save_step, flip, power], sort_keys=True,
                                    default=str).encode())
    for path in workload_files(resolve(scenario.workload).argv(scenario.steps, scenario.args)):
        key.update(path.read_bytes())
    folder = state.root / "_sweeps" / key.hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # one recording per session, xdist workers wait
        recorded = folder / "points.json"
        if not recorded.exists():
            try:
                found = record(scenario, folder / "run", rank=rank, save_step=save_step,
                               flip=flip, power=power)
            except (RuntimeError, ValueError) as e:
                raise pytest.UsageError(f"{where}: {e}") from None
            recorded.write_text(json.dumps([asdict(p) for p in found]))
    found = [FilePoint(**p) for p in json.loads(recorded.read_text())]
    metafunc.parametrize("file_point", found, ids=[p.id for p in found])


_SESSION = uuid.uuid4().hex   # this process's session, when not under xdist


def record(scenario: Any, run_dir: Path, *, rank: int = 0, save_step: int | None = None,
           flip: bool = False, power: bool = False) -> list[FilePoint]:
    """Run ``scenario`` clean (no faults) recording every file event, and return the crash
    points of one save. Raises ``RuntimeError`` naming the logs if that run did not finish,
    ``ValueError`` if the rank saved nothing there (or not at ``save_step``)."""
    import dataclasses

    from pytest_reshard.history import History
    from pytest_reshard.schedule import Schedule
    from pytest_reshard.supervisor.run import Supervisor

    clean = dataclasses.replace(scenario, files=True, schedule=Schedule(scenario.schedule.seed))
    Supervisor(clean, run_dir).run()
    history = History.load(run_dir)
    final = history.final_generation
    if not history.finished():
        raise RuntimeError(f"the clean run that records the save's file events did not finish "
                           f"({final.cause if final else 'no generation'}"
                           f"{': ' + final.detail if final and final.detail else ''}): see "
                           f"{run_dir / 'logs'}")
    try:
        return points(history.rank_events(gen=0), rank=rank, save_step=save_step, flip=flip, power=power)
    except ValueError as e:
        raise ValueError(f"{e} (the clean run: {run_dir})") from None


def _backend(backend: str, where: str) -> str:
    """The sweep's recording run needs a real backend, not ``auto`` (the plugin resolves it the
    same way for reshard_run)."""
    import pytest

    from pytest_reshard.session import resolve_backend

    try:
        return resolve_backend(backend)
    except ValueError as e:
        raise pytest.UsageError(f"{where}: {e}") from None
