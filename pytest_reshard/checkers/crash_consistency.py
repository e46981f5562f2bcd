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

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History
from pytest_reshard.verdict import Verdict

__all__ = ["crash_consistency", "manifests", "written", "Checkpoints", "describe_crash"]

CHECK = "crash_consistency"


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def _moved(path: str, src: str, dst: str) -> str:
    return dst + path[len(src):]


def manifests(events: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, int | None]]:
    """``{step: {path: size}}``: the files each save of a (clean) run left, by final name."""
    owner: dict[str, int] = {}       # a file now on disk -> the save it belongs to
    made: dict[str, int] = {}        # a folder -> the step in whose window it was created
    out: dict[int, dict[str, int | None]] = {}
    for e in events:
        step, op, path = e.get("at_step"), e["op"], e["path"]
        if step is None:
            continue
        if op == "mkdir":
            made[path] = step
        elif op == "close":
            folder = made.get(os.path.dirname(path))
            k = folder if folder is not None and folder < step else step
            owner[path] = k
            out.setdefault(k, {})[path] = e.get("size")
        elif op == "rename" and e.get("dst") not in (None, "(outside)"):
            dst = e["dst"]
            for p in [p for p in owner if _under(p, path)]:
                k = owner.pop(p)
                q = _moved(p, path, dst)
                owner[q] = k
                out[k][q] = out[k].pop(p, None)
            for d in [d for d in made if _under(d, path)]:
                made[_moved(d, path, dst)] = made.pop(d)
        elif op in ("unlink", "rmdir", "rmtree"):
            for p in [p for p in owner if _under(p, path)]:
                k = owner.pop(p)
                if k == step:             # written and removed by the same save: a temporary
                    out[k].pop(p, None)
    return {k: v for k, v in out.items() if v}


def written(events: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int] | None]:
    """``{path: (size, crc)}`` of what a run last finished writing to each file it still has;
    None for a file opened for writing (or torn) whose write never finished."""
    out: dict[str, tuple[int, int] | None] = {}
    for e in events:
        op, path = e["op"], e["path"]
        if op == "open" or (op == "write" and e.get("killed")):
            out[path] = None
        elif op == "close" and "crc" in e:
            out[path] = (int(e["size"]), int(e["crc"]))
        elif op == "truncate":
            out[path] = None
        elif op == "rename" and e.get("dst") not in (None, "(outside)"):
            for p in [p for p in out if _under(p, path)]:
                out[_moved(p, path, e["dst"])] = out.pop(p)
        elif op in ("unlink", "rmdir", "rmtree"):
            for p in [p for p in out if _under(p, path)]:
                del out[p]
    return out


@dataclass
class Checkpoints:
    """What was on disk when one generation ended: each checkpoint complete or not, and why."""

    complete: list[int] = field(default_factory=list)
    problems: dict[int, list[str]] = field(default_factory=dict)   # step -> what is wrong

    @property
    def newest(self) -> int | None:
        return max(self.complete) if self.complete else None


def judge_disk(disk: Mapping[str, Sequence[Any]], wanted: Mapping[int, Mapping[str, int | None]],
               done: Mapping[str, tuple[int, int] | None]) -> Checkpoints:
    """Which of the checkpoints in ``wanted`` the folder ``disk`` holds complete."""
    out = Checkpoints()
    for k in sorted(wanted):
        wrong = []
        for path, size in sorted(wanted[k].items()):
            have = disk.get(path)
            last = done.get(path)
            if have is None:
                wrong.append(f"`{path}` missing")
            elif path in done and last is None:
                wrong.append(f"`{path}` torn ({have[0]} bytes; its write never finished)")
            elif last is not None and (int(have[0]), int(have[1])) != last:
                wrong.append(f"`{path}` {_differs(have, last)}")
        if wrong:
            out.problems[k] = wrong
        else:
            out.complete.append(k)
    return out


def describe_crash(events: Iterable[Mapping[str, Any]]) -> str | None:
    """``rank 0 was killed before `rename a -> b` (file event 14 in step 9)``, or None."""
    for e in events:
        if e.get("killed"):
            what = f"`{e['op']} {e['path']}" + (f" -> {e['dst']}`" if e.get("dst") else "`")
            how = (f"after {e.get('tear_bytes') or 'half the'} bytes of" if e["killed"] == "torn"
                   else "before")
            return f"rank {e['rank']} was killed {how} {what} (file event {e.get('n')} since " \
                   f"the kill was armed, in step {e.get('at_step')})"
    return None


def _resumed_from(history: History, gen: int) -> tuple[int | None, str]:
    """The step whose state generation ``gen`` loaded (None: it started from scratch)."""
    loads = history.checkpoints("load", gen=gen)
    if loads:
        first = min(loads, key=lambda c: c.index)
        return first.step, str(first.info.get("source") or "checkpoint")
    g = history.generations[gen]
    if g.resume_step is None or g.resume_step <= 0:
        return None, "fresh"
    return g.resume_step - 1, "checkpoint"


Manifests = Mapping[int, Mapping[str, "int | None"]]


def crash_consistency(history: History, manifests_at: Callable[[Sequence[str]], Manifests]
                      ) -> Verdict:
    """Each generation after the first resumed from the newest checkpoint complete on disk
    when the one before it ended. ``manifests_at(roles)``: ``manifests`` of the clean reference
    run with those ranks (a save's files depend on the world size); it raises ``LookupError``
    saying why when there is none."""
    replay = history.replay
    try:
        wanted = _wanted(history, manifests_at)
    except LookupError as e:
        return Verdict.unknown(CHECK, str(e), replay=replay)
    if not wanted:
        return Verdict.unknown(CHECK, "the clean reference run wrote no file under the work "
                               "folder (run.workdir): the workload's checkpoints are elsewhere, "
                               "where the probe does not watch", replay=replay)
    gens = sorted(history.generations)
    files = history.file_events()
    problems: list[str] = []
    judged: list[str] = []
    for g, nxt in zip(gens, gens[1:]):
        disk = history.disk(g)
        if disk is None:
            return Verdict.unknown(CHECK, f"no record of the work folder as generation {g} left "
                                   "it (elastic agents restarted the ranks themselves, or the "
                                   "scenario did not record files)", generation=g, replay=replay)
        upto = [e for e in files if e["gen"] <= g]
        reached = {e.get("at_step") for e in upto}
        state = judge_disk(disk, {k: v for k, v in wanted.items() if k in reached},
                           written(upto))
        crash = describe_crash(e for e in upto if e["gen"] == g)
        ended = history.generations[g]
        when = f"when generation {g} ended ({ended.cause or 'unknown'}" + \
            (f": {crash})" if crash else ")")
        last = max((e["at_step"] for e in upto if e["gen"] == g and e.get("at_step") is not None
                    and e["op"] != "read"), default=None)
        if ended.planned and last in state.problems:
            problems.append(f"generation {g} ended as planned ({ended.cause}) after its save of "
                            f"step {last}, but that checkpoint was not complete on disk: "
                            f"{'; '.join(state.problems[last])}; a save must be finished (an "
                            "async save awaited, its commit written) before the rank exits")
        later = [x for x in gens if x > g]
        started = next((x for x in later if history.begun(x)), None)
        if started is None:
            unreadable = _unreadable(history, later, disk, written(upto))
            if unreadable:
                problems.append(f"the job could not start again: generation {nxt} read "
                                f"{unreadable}, {when}")
            continue
        step, source = _resumed_from(history, started)
        newest = state.newest
        if step is not None and step in state.problems and source != "emergency":
            problems.append(f"generation {started} resumed from step {step}, whose checkpoint "
                            f"was not complete {when}: {'; '.join(state.problems[step])}")
        elif newest is not None and (step is None or step < newest):
            skipped = sorted({os.path.dirname(p) + "/" if "/" in p else p for p in wanted[newest]})
            problems.append(f"generation {started} resumed from "
                            f"{'scratch' if step is None else f'step {step}'}, a rewind beyond "
                            f"the newest complete checkpoint: step {newest} ({', '.join(skipped)}) "
                            f"was complete {when}")
        elif newest is None and step is None and state.problems:
            lost = max(state.problems)
            problems.append(f"no checkpoint was complete {when}, so generation {started} started "
                            f"from scratch; the newest, step {lost}: "
                            f"{'; '.join(state.problems[lost])}")
        else:
            judged.append(f"generation {started} resumed from "
                          f"{'scratch' if step is None else f'step {step} ({source})'}, the "
                          f"newest complete {when}")
    if problems:
        return Verdict.failed(CHECK, problems[0] + (f" (and {len(problems) - 1} more)"
                                                     if len(problems) > 1 else ""),
                              details={"problems": problems}, replay=replay)
    if not judged:
        return Verdict.passed(CHECK, "no generation resumed from the work folder; every "
                              f"checkpoint of the run's {len(wanted)} saves was written",
                              replay=replay)
    return Verdict.passed(CHECK, "; ".join(judged), replay=replay)


def _wanted(history: History, manifests_at: Callable[[Sequence[str]], Manifests]
            ) -> dict[int, Mapping[str, int | None]]:
    """Each save's files, from the clean run at the topology of the generation that made it."""
    roles_of = {g: tuple(gen.roles) for g, gen in history.generations.items()}
    made_at: dict[int, tuple[str, ...]] = {}       # step -> the ranks that saved it
    for e in history.file_events():
        if e.get("at_step") is not None and e["gen"] in roles_of:
            made_at[e["at_step"]] = roles_of[e["gen"]]
    out: dict[int, Mapping[str, int | None]] = {}
    for roles in sorted(set(made_at.values())):
        for k, files in manifests_at(roles).items():
            if made_at.get(k) == roles:
                out[k] = files
    return out


def _unreadable(history: History, gens: Sequence[int], disk: Mapping[str, Sequence[Any]],
                done: Mapping[str, tuple[int, int] | None]) -> str | None:
    """The first file the generations ``gens`` read that was missing or torn on ``disk``."""
    for e in history.file_events():
        if e["gen"] not in gens or e["op"] != "read":
            continue
        path = e["path"]
        have, last = disk.get(path), done.get(path, ())
        if have is None and path not in done and not any(p.startswith(path + "/") for p in disk):
            return f"`{path}`, which did not exist"
        if have is not None and path in done and last is None:
            return f"`{path}`, torn ({have[0]} bytes, its write never finished)"
        if have is not None and last and (int(have[0]), int(have[1])) != last:
            return f"`{path}`, which {_differs(have, last)}"
    return None


def _differs(have: Sequence[Any], last: tuple[int, int]) -> str:
    """How a file on disk differs from what the run last wrote to it."""
    if int(have[0]) != last[0]:
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
        return manifests(clean.history.file_events())

    return crash_consistency(ctx.history, manifests_at)
