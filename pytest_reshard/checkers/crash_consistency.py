"""crash_consistency: each resume loads a checkpoint that was complete when the generation before
it ended, and the newest such one.

Judged from files, not from what the workload says about them: the ranks' file events
(``pytest_reshard.filewatch``) and the work folder as each generation left it (``RunDir.disk``).

- **What checkpoint K is made of** comes from the clean reference run: the files its save of step
  K left, under their final names (written from the start of step K to the start of the next;
  a file written later into a folder that save created, an async save's marker, belongs to it too).
- **A file is complete** when its size and CRC on disk are those this run recorded at its last
  close: a torn write, an open that truncated it, or a kill before its data was written leaves
  something else.
- **Checkpoint K is complete** when each of its files is there and complete.

A resume from an incomplete checkpoint fails naming what was missing or torn; a resume older than
the newest complete one (or from scratch with one there) fails naming the one it skipped; a
generation that never began a step after reading a torn or missing file fails naming the file.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.contract import MUTATIONS, OUTSIDE, FileKill, FileOp
from pytest_reshard.history import Checkpoint, FileEvent, History, Saved, file_trail
from pytest_reshard.verdict import Verdict

__all__ = ["crash_consistency", "manifests", "written", "Disk", "Checkpoints", "describe_crash"]

CHECK = "crash_consistency"


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def _moved(path: str, src: str, dst: str) -> str:
    return dst + path[len(src):]


Trail = Sequence["FileEvent | Saved"]
#: Removing ops: what they name is gone afterwards.
_REMOVALS = (FileOp.UNLINK, FileOp.RMDIR, FileOp.RMTREE)


def saves_of(events: Trail) -> dict[int, int | None]:
    """The save each file event (by its index in ``events``) belongs to.

    A rank that records its saves (``run.checkpoint_saved(step)``, once the save is complete)
    names them: its file events up to that record belong to that step's save, however late an
    async save's thread wrote them. Without such a record, a file belongs to the step in
    progress when it was closed, or to the save that created its folder in an earlier step."""
    out: dict[int, int | None] = {}
    pending: dict[tuple[int, int], list[int]] = {}
    for i, e in enumerate(events):
        if isinstance(e, Saved):
            for j in pending.pop((e.gen, e.rank), []):
                out[j] = e.step
        elif e.op in MUTATIONS and e.at_step is not None:
            pending.setdefault((e.gen, e.rank), []).append(i)   # (before a step: setup)
    containers = _containers(events)
    made: dict[str, int | None] = {}   # a folder -> the save that created it (the first)
    for i, e in enumerate(events):
        if isinstance(e, FileEvent) and e.op == FileOp.MKDIR and i in out:
            made.setdefault(e.path, out[i])   # a recorded save's folder, whoever made it first
    for i, e in enumerate(events):
        if not isinstance(e, FileEvent) or e.op not in MUTATIONS:
            continue
        step = e.at_step
        if e.op == FileOp.MKDIR and step is not None:
            made.setdefault(e.path, out.get(i, step))
        elif e.op == FileOp.RENAME and e.dst:
            for d in [d for d in made if _under(d, e.path)]:
                made[_moved(d, e.path, e.dst)] = made.pop(d)
        if i not in out:
            parent = os.path.dirname(e.path)
            folder = made.get(parent) if parent not in containers else None
            out[i] = folder if folder is not None and step is not None and folder < step else step
    return out


def _containers(events: Trail) -> set[str]:
    """Folders that hold many saves, not one (``ckpt/``): a later step creates a folder in
    them, or they get files of three steps or more. A save's own folder gets its files in one
    step, and at most a marker later."""
    made: dict[str, int] = {}
    steps: dict[str, set[int]] = {}
    out: set[str] = set()
    for e in events:
        if not isinstance(e, FileEvent) or e.at_step is None:
            continue
        step = e.at_step
        parent = os.path.dirname(e.path)
        if e.op == FileOp.MKDIR:
            made.setdefault(e.path, step)
            if parent in made and made[parent] < step:
                out.add(parent)
        elif e.op == FileOp.CLOSE:
            steps.setdefault(parent, set()).add(step)
            if len(steps[parent]) >= 3:
                out.add(parent)
    return out


class Disk:
    """The work folder as a run's file events leave it: each file's last finished write
    ``(size, crc, save)`` (``save``: the step whose save it belongs to, ``saves_of``), None
    while a write to it is unfinished (opened, torn), and the event that removed each file that
    is gone. A file made through a raw descriptor (``Path.touch``, ``os.open``) has no size or
    CRC on record: whatever is on disk is taken as what was written."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[Any, Any, int | None] | None] = {}
        self.removed: dict[str, FileEvent] = {}
        #: path -> {save: (size, crc)}: what each save wrote there (a file each save rewrites
        #: with the same bytes holds every one of them)
        self.by_save: dict[str, dict[int | None, tuple[Any, Any]]] = {}
        #: the sources of renames a crash stopped: files waiting under their staging names
        self.staged: set[str] = set()

    def _put(self, path: str, size: Any, crc: Any, save: int | None) -> None:
        self.files[path] = (size, crc, save)
        self.by_save.setdefault(path, {})[save] = (size, crc)

    def apply(self, e: FileEvent, save: int | None) -> list[tuple[str, str]]:
        """Apply one file event of the save ``save``; the ``(old, new)`` paths it moved."""
        op, path = e.op, e.path
        if e.killed in (FileKill.BEFORE, FileKill.POWER) and op != FileOp.CLOSE:
            if op == FileOp.RENAME:
                self.staged.add(path)
            return []                 # killed before it: it never happened (a close's data is written)
        dst = e.dst
        if op == FileOp.OPEN and e.raw:
            self._put(path, None, None, save)
        elif op in (FileOp.COPY, FileOp.RENAME) and path == OUTSIDE and dst not in (None, OUTSIDE):
            self._put(dst, None, None, save)   # bytes from outside the folder: not on record
        elif op == FileOp.COPY and dst not in (None, OUTSIDE):
            self._put(dst, None, None, save)
        elif op == FileOp.SYMLINK:
            self._put(path, -1, "-> " + str(e.target), save)   # as the snapshot shows it
        elif op in (FileOp.OPEN, FileOp.TRUNCATE) or (op == FileOp.WRITE and e.killed):
            self.files[path] = None
        elif op == FileOp.CLOSE:
            self._put(path, e.size, e.crc, save)
        elif op == FileOp.RENAME and dst not in (None, OUTSIDE):
            moved = [(p, _moved(p, path, dst)) for p in self.files if _under(p, path)]
            for old, new in moved:
                self.files[new] = self.files.pop(old)
                self.by_save[new] = self.by_save.pop(old, {})
            return moved
        elif op in _REMOVALS:
            for p in [p for p in self.files if _under(p, path)]:
                del self.files[p]
                self.removed[p] = e
        return []




def manifests(events: Iterable[Any]) -> dict[int, dict[str, int | None]]:
    """``{step: {path: size}}``: the files each save of a (clean) run left, by final name.
    ``events``: the run's rank events in order, raw or as ``History`` records (its file events
    and save records are read)."""
    events = file_trail(events)
    save = saves_of(events)
    disk = Disk()
    out: dict[int, dict[str, int | None]] = {}
    for i, e in enumerate(events):
        k = save.get(i)
        if not isinstance(e, FileEvent) or k is None:
            continue
        before = dict(disk.files)
        for old, new in disk.apply(e, k):
            got = disk.files[new]
            if got is not None and got[2] in out:
                out[got[2]][new] = out[got[2]].pop(old, got[0])
        target = e.dst if e.path == OUTSIDE else e.path
        if e.op in (FileOp.CLOSE, FileOp.SYMLINK) or (e.op == FileOp.OPEN and e.raw) or \
                (e.op in (FileOp.COPY, FileOp.RENAME) and e.path == OUTSIDE):
            got = disk.files.get(target)
            if got is not None and got[2] is not None:  # (always: every file here is a save's)
                out.setdefault(got[2], {})[target] = got[0] if e.op == FileOp.CLOSE else None
        elif e.op in _REMOVALS:
            for p, got in before.items():     # written and removed by one save: a temporary
                if p not in disk.files and got is not None and got[2] == k:
                    out.get(k, {}).pop(p, None)
    for path in _logs(events):                 # written more often than saved: not a checkpoint
        for files in out.values():
            files.pop(path, None)
    return {k: v for k, v in out.items() if v}


def _logs(events: Trail) -> set[str]:
    """Files a rank writes as it trains, not as it saves (a log, a metrics file): closed in two
    different steps between two of its recorded saves (a save writes each of its files once),
    or, by a rank that records no saves, closed both in a step where it closed nothing else and
    in a step where it closed other files too (a save's files come together)."""
    out: set[str] = set()
    seen: dict[tuple[int, int], dict[str, int]] = {}   # (gen, rank) -> path -> step closed
    closed: dict[tuple[int, int, int], set[str]] = {}  # (gen, rank, step) -> paths closed
    for e in events:
        key = (e.gen, e.rank)
        if isinstance(e, Saved):
            seen[key] = {}
        elif e.op == FileOp.CLOSE and e.at_step is not None:
            closed.setdefault((*key, e.at_step), set()).add(e.path)
            if key in seen:
                first = seen[key].setdefault(e.path, e.at_step)
                if first != e.at_step:
                    out.add(e.path)
    alone: set[tuple[int, int, str]] = set()
    together: set[tuple[int, int, str]] = set()
    for (gen, rank, _), paths in closed.items():
        if (gen, rank) in seen:
            continue
        for path in paths:
            (alone if len(paths) == 1 else together).add((gen, rank, path))
    return out | {path for gen, rank, path in alone & together}


def written(events: Iterable[Any], undone: Sequence[tuple[int, str, str]] = ()) -> Disk:
    """The work folder as a run's rank events (in order, raw or as records) leave it.
    ``undone``: renames a power loss took back, as ``(generation, dst, src)``: the newest
    rename of each in that generation never happened."""
    events = file_trail(events)
    save = saves_of(events)
    renames = [(i, e) for i, e in enumerate(events)
               if isinstance(e, FileEvent) and e.op == FileOp.RENAME]
    skip: set[int] = set()
    for gen, dst, src in undone:
        found = next((i for i, e in reversed(renames) if i not in skip and e.gen == gen
                      and e.path == src and e.dst == dst), None)
        if found is not None:
            skip.add(found)
    disk = Disk()
    for i, e in enumerate(events):
        if isinstance(e, FileEvent) and i not in skip:
            disk.apply(e, save.get(i))
    return disk


@dataclass
class Checkpoints:
    """What was on disk when one generation ended: each checkpoint complete or not, and why."""

    complete: list[int] = field(default_factory=list)
    problems: dict[int, list[str]] = field(default_factory=dict)   # step -> what is wrong
    unverified: dict[int, list[str]] = field(default_factory=dict)  # step -> files not on record

    @property
    def newest(self) -> int | None:
        return max(self.complete) if self.complete else None


def _entry(have: Sequence[Any]) -> tuple[Any, Any]:
    """A snapshot entry as the pair the run's records use: (size, crc), (-1, "-> target")."""
    return (have[0], have[1])


def judge_disk(disk: Mapping[str, Sequence[Any]], wanted: Mapping[int, Mapping[str, int | None]],
               done: Disk) -> Checkpoints:
    """Which of the checkpoints in ``wanted`` the folder ``disk`` holds complete, given what the
    run wrote (``done``)."""
    out = Checkpoints()
    for k in sorted(wanted):
        wrong = []
        missing: dict[tuple[str, str], list[str]] = {}   # (folder, how) -> files
        for path in sorted(wanted[k]):
            have = disk.get(path)
            last = done.files.get(path)
            mine = done.by_save.get(path, {}).get(k)
            if have is None:
                gone = done.removed.get(path) if path not in done.files else None
                how = f"removed by `{gone.op} {gone.path}` in step {gone.at_step}" \
                    if gone is not None else "missing"
                missing.setdefault((os.path.dirname(path), how), []).append(path)
            elif path in done.files and last is None:
                wrong.append(f"`{path}` torn ({have[0]} bytes; its write never finished)")
            elif last is not None and last[1] is None:
                if have[0] != 0:      # an empty marker is what it is; anything else: unverified
                    out.unverified.setdefault(k, []).append(path)
            elif last is not None and _entry(have) != last[:2]:
                wrong.append(f"`{path}` {_differs(have, last)}")
            elif last is not None and last[2] is not None and last[2] < k and \
                    mine != _entry(have):
                wrong.append(f"`{path}` holds the save of step {last[2]}, not of step {k}")
            elif last is not None and last[2] != k and mine != _entry(have):
                # written by a later save, or by this one counted as later (an async save's
                # thread that no record names): its bytes cannot be told from this save's
                out.unverified.setdefault(k, []).append(path)
        unnamed = sorted(p for p, by in done.by_save.items() if k in by and p in disk
                         and p not in wanted[k] and not any(_under(p, s) for s in done.staged))
        if unnamed and sum(map(len, missing.values())) == len(wanted[k]) and \
                {os.path.basename(p) for p in unnamed} == {os.path.basename(p) for p in wanted[k]}:
            # none of the clean run's names, the same files under another folder name: names
            # that differ from run to run (a run id, a timestamp), not a lost checkpoint
            out.unverified.setdefault(k, []).extend(unnamed)
            continue
        for (folder, how), paths in missing.items():
            wrong.insert(0, f"`{paths[0]}` {how}" if len(paths) == 1 else
                         f"`{folder}/` ({len(paths)} files) {how}")
        if wrong:
            out.problems[k] = wrong
        else:
            out.complete.append(k)
    return out


def describe_crash(events: Iterable[Any]) -> str | None:
    """``rank 0 was killed before `rename a -> b` (file event 14 in step 9)``, or None."""
    for e in file_trail(events):
        if isinstance(e, FileEvent) and e.killed:
            what = f"`{e.op} {e.path}" + (f" -> {e.dst}`" if e.dst else "`")
            if e.killed == FileKill.POWER:
                return f"the power went as rank {e.rank} was about to {what} (file event " \
                       f"{e.n} since the power loss was armed, in step {e.at_step})"
            how = (f"after {e.tear_bytes or 'half the'} bytes of" if e.killed == FileKill.TORN
                   else "before")
            return f"rank {e.rank} was killed {how} {what} (file event {e.n} since " \
                   f"the kill was armed, in step {e.at_step})"
    return None


def _resumed_from(history: History, gen: int) -> tuple[list[int | None], str]:
    """The steps whose state generation ``gen``'s ranks loaded before their first step (None:
    from scratch), one per rank that recorded a load, else the generation's declared resume."""
    first_begin: dict[int, int] = {}
    for a in history.attempts(gen):
        first_begin.setdefault(a.rank, a.begin_index)
    loads: dict[int, Checkpoint] = {}
    for c in history.checkpoints("load", gen=gen):
        if c.index < first_begin.get(c.rank, math.inf):
            loads.setdefault(c.rank, c)
    g = history.generations[gen]
    if loads:
        steps: list[int | None] = [c.step for _, c in sorted(loads.items())]
        source = next((str(c.info.get("source")) for c in loads.values() if c.info.get("source")),
                      g.resume_source or "checkpoint")
        return steps, source
    if g.resume_step is None or g.resume_step <= 0:
        return [None], "fresh"
    return [g.resume_step - 1], g.resume_source or "checkpoint"


Manifests = Mapping[int, Mapping[str, "int | None"]]


def crash_consistency(history: History, manifests_at: Callable[[Sequence[str]], Manifests]
                      ) -> Verdict:
    """Each generation after the first resumed from the newest checkpoint complete on disk
    when the one before it ended. ``manifests_at(roles)``: ``manifests`` of the clean reference
    run with those ranks (a save's files depend on the world size); it raises ``LookupError``
    saying why when there is none."""
    try:
        wanted = _wanted(history, manifests_at)
    except LookupError as e:
        return Verdict.unknown(CHECK, str(e))
    if not wanted:
        return Verdict.unknown(CHECK, "the clean reference run wrote no file under the work "
                               "folder (run.workdir): the workload's checkpoints are elsewhere, "
                               "where the probe does not watch")
    gens = sorted(history.generations)
    files = history.file_trail()
    save = saves_of(files)
    wanted = {**_unmatched(wanted, files, save), **wanted}
    problems: list[str] = []
    judged: list[str] = []
    cannot: list[str] = []             # why a transition could not be judged

    def claimed(g: int) -> set[int]:
        """The steps whose saves the workload recorded as complete up to generation ``g``."""
        return {c.step for c in history.checkpoints("save") if c.gen <= g}

    for g, nxt in zip(gens, gens[1:]):
        disk = history.disk(g)
        if disk is None:
            cannot.append(f"no record of the work folder as generation {g} left it (elastic "
                          "agents restarted the ranks themselves, or the scenario did not "
                          "record files)")
            continue
        upto = [e for e in files if e.gen <= g]
        undone = [(loss.gen, dst, src) for loss in history.power_losses() if loss.gen <= g
                  for dst, src in loss.renames_undone]
        reached = {save[i] for i, e in enumerate(files) if e.gen <= g and i in save} | {
            k for x in gens if x <= g for k in history.begun(x)}   # its saves, the steps it began
        state = judge_disk(disk, {k: v for k, v in wanted.items() if k in reached},
                           written(upto, undone))
        crash = describe_crash(e for e in upto if e.gen == g)
        ended = history.generations[g]
        when = f"when generation {g} ended ({ended.cause or 'unknown'}" + \
            (f": {crash})" if crash else ")")
        last = max((k for i, k in save.items() if files[i].gen == g and k is not None),
                   default=None)
        if ended.planned and last in state.problems:
            problems.append(f"generation {g} ended as planned ({ended.cause}) after its save of "
                            f"step {last}, but that checkpoint was not complete on disk: "
                            f"{'; '.join(state.problems[last])}; a save must be finished (an "
                            "async save awaited, its commit written) before the rank exits")
        lost = _lost_to_power(history, g, state, wanted)
        if lost:
            problems.append(f"{lost}, {when}")
        later = [x for x in gens if x > g]
        started = next((x for x in later if history.begun(x)), None)
        if started is None:
            unreadable = _unreadable(history, later, disk, written(upto, undone))
            broken = [k for k in state.problems if state.newest is None or k > state.newest]
            if unreadable:
                problems.append(f"the job could not start again: generation {nxt} read "
                                f"{unreadable}, {when}")
            elif broken:   # it looked at them without opening them (os.path.isfile, listdir)
                k = max(broken)
                problems.append(f"the job could not start again after generation {g} left the "
                                f"checkpoint of step {k} incomplete ({when}: "
                                f"{'; '.join(state.problems[k])}): a resume that takes the "
                                "newest checkpoint without checking it is complete fails so; "
                                "the error is in the ranks' logs (see liveness)")
            continue
        steps, source = _resumed_from(history, started)
        if len(set(steps)) > 1:
            problems.append(f"the ranks of generation {started} resumed from different steps "
                            f"({', '.join('scratch' if k is None else str(k) for k in steps)}, "
                            f"rank by rank), {when}")
            continue
        step, newest = steps[0], state.newest
        if step is not None and step not in wanted and source != "emergency":
            cannot.append(f"generation {started} resumed from step {step}, a save the clean "
                          "reference run does not make: what it should hold is unknown")
            continue
        doubt = [k for k in state.unverified if step is None or k >= step]
        rewind = newest is not None and (step is None or step < newest)
        if step is not None and step in state.problems and source != "emergency":
            problems.append(f"generation {started} resumed from step {step}, whose checkpoint "
                            f"was not complete {when}: {'; '.join(state.problems[step])}")
        elif rewind and newest is not None and newest not in doubt:
            skipped = sorted({os.path.dirname(p) + "/" if "/" in p else p for p in wanted[newest]})
            problems.append(f"generation {started} resumed from "
                            f"{'scratch' if step is None else f'step {step}'}, a rewind beyond "
                            f"the newest complete checkpoint: step {newest} ({', '.join(skipped)}) "
                            f"was complete {when}")
        elif doubt and source != "emergency":
            k = max(doubt)
            cannot.append(f"generation {started} resumed from "
                          f"{'scratch' if step is None else f'step {step}'}, but the "
                          f"checkpoint of step {k} cannot be verified: "
                          f"{', '.join(f'`{p}`' for p in state.unverified[k])} (written where "
                          "the probe cannot see, under names the clean run does not use, or by "
                          "an async save's thread that no checkpoint_saved names)")
        elif newest is None and step is None and (destroyed := [
                k for k in state.problems if k != last and k in claimed(g)]):
            # an earlier save the workload had recorded complete was broken by a later one
            each = "; ".join(f"step {k}: {', '.join(state.problems[k])}"
                             for k in sorted(state.problems, reverse=True))
            problems.append(f"no checkpoint was complete {when}, so generation {started} started "
                            f"from scratch, though the save of step {max(destroyed)} had been "
                            f"completed ({each})")
        elif step is None:
            judged.append(f"generation {started} started from scratch: no checkpoint was "
                          f"complete {when}")
        else:
            judged.append(f"generation {started} resumed from step {step} ({source}), the "
                          f"newest complete {when}")
    if problems:
        return Verdict.failed(CHECK, problems[0] + (f" (and {len(problems) - 1} more)"
                                                     if len(problems) > 1 else ""),
                              details={"problems": problems})
    if cannot:
        return Verdict.unknown(CHECK, "; ".join(cannot), details={"judged": judged})
    if not judged:
        return Verdict.passed(CHECK, "no generation resumed from the work folder")
    return Verdict.passed(CHECK, "; ".join(judged))


def _lost_to_power(history: History, g: int, state: Checkpoints,
                   wanted: Mapping[int, Mapping[str, int | None]]) -> str | None:
    """A power loss in generation ``g`` that took the newest save the workload had recorded
    complete before it: what a save must not lose once it says it is done."""
    loss = next((p for p in history.power_losses() if p.gen == g), None)
    cut = next((e.t for e in history.file_trail(gen=g)
                if isinstance(e, FileEvent) and e.killed == FileKill.POWER), None)
    if loss is None or cut is None:
        return None
    saves = history.checkpoints("save", gen=g)
    savers = {c.rank for c in saves}   # a save is complete once each of them recorded it
    by_step: dict[int, set[int]] = {}
    for c in saves:
        if c.t < cut and c.step in wanted:
            by_step.setdefault(c.step, set()).add(c.rank)
    done = [k for k, ranks in by_step.items() if ranks >= savers]
    if not done or max(done) not in state.problems:
        return None
    k = max(done)
    why = sorted({w for path in wanted[k] if (w := loss.why(path)) is not None})
    return (f"the power loss took the save of step {k}, which the workload had recorded "
            f"complete before it: {'; '.join(state.problems[k])}"
            + (f" ({'; '.join(why)})" if why else "")
            + ": a save is durable only once its files are fsynced, then renamed into place, "
            "then their folder fsynced")


def _wanted(history: History, manifests_at: Callable[[Sequence[str]], Manifests]
            ) -> dict[int, Mapping[str, int | None]]:
    """Each save's files, from the clean run at the topology of the generation that made it."""
    roles_of = {g: tuple(gen.roles) for g, gen in history.generations.items()}
    made_at: dict[int, tuple[str, ...]] = {}       # step -> the ranks that saved it
    files = history.file_trail()
    for i, k in saves_of(files).items():
        if k is not None and files[i].gen in roles_of:
            made_at[k] = roles_of[files[i].gen]
    first = tuple(history.generations[min(history.generations)].roles) \
        if history.generations else ()
    out: dict[int, Mapping[str, int | None]] = {}
    for roles in sorted(set(made_at.values()) | {first}):
        for k, manifest in manifests_at(roles).items():
            if made_at.get(k, first) == roles:   # a save the run never made: the first topology
                out[k] = manifest
    return out


def _unmatched(wanted: Mapping[int, Mapping[str, int | None]], files: Trail,
               save: Mapping[int, int | None]) -> dict[int, dict[str, int | None]]:
    """What the run's saves that the clean run does not make (a planned exit's) should hold: the
    files of the clean run's save before it, moved into the folder that save created."""
    made: dict[int, list[str]] = {}
    for i, e in enumerate(files):
        if not isinstance(e, FileEvent):
            continue
        k = save.get(i)
        if k is not None and k not in wanted and e.op == FileOp.MKDIR and \
                e.path not in made.get(k, []):
            made.setdefault(k, []).append(e.path)
        elif e.op == FileOp.RENAME and e.dst and e.killed not in (FileKill.BEFORE, FileKill.POWER):   # .tmp -> final
            for folders in made.values():
                folders[:] = [_moved(d, e.path, e.dst) if _under(d, e.path) else d
                              for d in folders]
    out: dict[int, dict[str, int | None]] = {}
    known = {p.rsplit("/", 1)[0] for files_ in wanted.values() for p in files_ if "/" in p}
    for k, folders in made.items():
        before = [j for j in wanted if j < k]
        if not before or len(folders) != 1 or folders[0] in known:
            continue   # (a folder the clean run knows: another save's, written late)
        model = wanted[max(before)]
        tops = {p.rsplit("/", 1)[0] for p in model if "/" in p}
        mine = max(tops, key=lambda t: sum(p.startswith(t + "/") for p in model)) if tops else None
        out[k] = {(folders[0] + p[len(mine):] if mine and p.startswith(mine + "/") else p): size
                  for p, size in model.items()}
    return out


def _unreadable(history: History, gens: Sequence[int], disk: Mapping[str, Sequence[Any]],
                done: Disk) -> str | None:
    """The first file the generations ``gens`` read that was missing or torn on ``disk``, after
    the files read before it (`latest`, which pointed there)."""
    before: list[str] = []
    for e in history.file_events():
        if e.gen not in gens or e.op != FileOp.READ:
            continue
        path = e.path
        have, last = disk.get(path), done.files.get(path)
        after = f"`{before[-1]}` and then " if before else ""
        if have is None and path not in done.files and \
                not any(p.startswith(path + "/") for p in disk):
            return f"{after}`{path}`, which did not exist"
        if have is not None and path in done.files and last is None:
            return f"{after}`{path}`, torn ({have[0]} bytes, its write never finished)"
        if have is not None and last and last[1] is not None and _entry(have) != last[:2]:
            return f"{after}`{path}`, which {_differs(have, last)}"
        if path in disk and path not in before:
            before.append(path)
    return None


def _differs(have: Sequence[Any], last: Sequence[Any]) -> str:
    """How a file on disk differs from what the run last wrote to it."""
    if have[0] != last[0]:
        return f"has {have[0]} bytes where {last[0]} were written"
    return f"changed after it was written (the same {last[0]} bytes, not the same content)"


def _applies(ctx: CheckContext) -> bool:
    """the scenario records file events (a kill_at_file_event, or files=True)"""
    return bool(ctx.scenario is not None and getattr(ctx.scenario, "files", False)) or \
        bool(ctx.history.file_events())


@register(CHECK, applies=_applies, column="crash",
          description="each resume loads the newest checkpoint that was complete on disk when "
                      "the generation before it ended, never an incomplete one")
def _check(ctx: CheckContext) -> Verdict:
    def manifests_at(roles: Sequence[str]) -> Manifests:
        clean = ctx.clean_reference(roles)
        if clean.history is None or clean.broken:
            raise LookupError(clean.broken or "no clean reference run (the history is judged on "
                              "its own), so what a complete checkpoint holds is unknown")
        return manifests(clean.history.file_trail())

    return crash_consistency(ctx.history, manifests_at)
