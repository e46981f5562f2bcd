"""silent_corruption: a flipped bit never reaches a checkpoint unnoticed, nor a resume."""
from __future__ import annotations

from typing import Callable

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.contract import FLIPPED, GUARD
from pytest_reshard.history import SAVE, Checkpoint, History
from pytest_reshard.verdict import Verdict

CHECK = "silent_corruption"
#: The fault kind that corrupts a tensor (``chaos.bitflip``).
BITFLIP = "bitflip"


def _differs(mine: Checkpoint, clean: Checkpoint | None) -> list[str]:
    """The components of a save that differ from the clean run's save of the same step."""
    if clean is None:
        return []
    return sorted(n for n, v in mine.digest.items() if n in clean.digest and clean.digest[n] != v)


def silent_corruption(history: History, clean_saves: Callable[[int], dict[int, Checkpoint]]
                      ) -> Verdict:
    """After a bit flip (``chaos.bitflip``), no save of the flipped generation holds state other
    than the clean run's at that step (whether or not the workload said its own check caught it,
    ``run.detected``: a job that notices and saves anyway has committed the corruption), and no
    generation resumes from such a save. ``clean_saves(gen)``:
    the clean run's saves by step, at generation ``gen``'s topology (``LookupError``: none).

    Silent corruption shows in nothing else the harness sees when the flip is small: the loss
    moves within noise, the state a resume loads equals what was saved. Only a save held against
    the clean run's shows the corrupted state got into a checkpoint."""
    never = history.never_started()
    if never is not None:
        return Verdict.unknown(CHECK, never)
    flips = [f for f in history.faults_fired() if f.kind == BITFLIP]
    if not flips:
        return Verdict.unknown(CHECK, "the scheduled bit flip never fired")
    saves = [c for c in history.checkpoints(SAVE) if c.digest]
    corrupted: list[tuple[Checkpoint, list[str]]] = []
    problems: list[str] = []
    flipped = {(n.gen, n.rank): n for n in history.notes(FLIPPED)}
    for f in flips:
        note = flipped.get((f.gen, f.rank))
        what = (f"bit {note.fields.get('bit')} of {note.fields.get('name')}'s {f.params.get('tensor')} "
                f"({note.fields.get('before')} -> {note.fields.get('after')})" if note else
                f"a bit of a {f.params.get('tensor')}")
        guards = [g for g in history.notes(GUARD, gen=f.gen) if g.t >= (f.t or 0.0)]
        noticed = min((g.t for g in guards), default=None)
        try:
            clean = clean_saves(f.gen)
        except LookupError as e:
            return Verdict.unknown(CHECK, f"no clean run to hold the saves against: {e}")
        for c in saves:
            if c.gen != f.gen or c.step < f.step or (f.t is not None and c.t < f.t):
                continue
            if c.step not in clean:
                continue
            bad = _differs(c, clean[c.step])
            if not bad:
                continue
            corrupted.append((c, bad))
            if noticed is not None and c.t >= noticed:
                g = min(guards, key=lambda n: n.t)
                problems.append(
                    f"the flip of {what} on rank {f.rank} at step {f.step} ({f.phase}, generation "
                    f"{f.gen}) reached the checkpoint of step {c.step} after rank {g.rank}'s own "
                    f"check had caught it at step {g.step} ({g.fields.get('kind')}): its "
                    f"{' and '.join(bad)} differ from the clean run's; the job noticed and saved "
                    "the corrupted state anyway: a check that catches a flip must stop the job "
                    "before its next save, so that it resumes from the last good one")
            else:
                problems.append(
                    f"the flip of {what} on rank {f.rank} at step {f.step} ({f.phase}, generation "
                    f"{f.gen}) reached the checkpoint of step {c.step} unnoticed: its "
                    f"{' and '.join(bad)} differ from the clean run's, and no rank's own check had "
                    "caught it (run.detected) before the save: a workload that claims to catch "
                    "silent corruption must check before it commits (a checksum of the replicas' "
                    "parameters, a NaN or spike guard on the loss)")
    bad_steps = {(c.step, c.gen) for c, _ in corrupted}
    for c in history.checkpoints("load"):
        if any(step == c.step and gen < c.gen for step, gen in bad_steps):
            problems.append(f"generation {c.gen} resumed from the checkpoint of step {c.step}, "
                            "which holds the corrupted state: a check that catches the flip "
                            "must also keep the job from loading what it saved after it")
            break
    details = {"corrupted": [[c.gen, c.rank, c.step, bad] for c, bad in corrupted],
               "problems": problems}
    if problems:
        f = flips[0]
        return Verdict.failed(CHECK, problems[0] + (f" (and {len(problems) - 1} more)"
                                                     if len(problems) > 1 else ""),
                              step=f.step, rank=f.rank, generation=f.gen,
                              fault=history.describe_fault(f.id), details=details)
    guards = history.notes(GUARD)
    if guards:   # named the same in every run: the first generation and step, the lowest rank
        g = min(guards, key=lambda n: (n.gen, n.step if n.step is not None else -1, n.rank))
        return Verdict.passed(CHECK, f"rank {g.rank}'s own check caught the flip at step "
                                     f"{g.step} ({g.fields.get('kind')}) before any save held it")
    return Verdict.passed(CHECK, "no save after the flip holds state other than the clean run's")


def _clean_saves(ctx: CheckContext) -> Callable[[int], dict[int, Checkpoint]]:
    def at(gen: int) -> dict[int, Checkpoint]:
        roles = ctx.history.generations[gen].roles
        clean = ctx.clean_reference(list(roles))
        if clean.history is None:
            raise LookupError(clean.broken or "the scenario was checked without clean runs")
        return {c.step: c for c in clean.history.checkpoints(SAVE) if c.digest}
    return at


@register(CHECK, column="sdc",
          applies=lambda ctx: ctx.scenario is not None and any(
              f.kind == BITFLIP for f in ctx.scenario.schedule.faults),
          when="a bit flip is scheduled (chaos.bitflip)",
          description="no flipped bit reaches a checkpoint, noticed by the workload's own "
                      "check or not, and no generation resumes from a corrupted save")
def _check(ctx: CheckContext) -> Verdict:
    return silent_corruption(ctx.history, _clean_saves(ctx))
