"""loss_continuity: the per-step loss of the kept steps matches a clean reference run.

The noise floor of a step is ``max(spread, 1e-7 * |reference loss|)``: the spread between clean
runs at different world sizes (measured, an input), never below one float32 rounding of the loss.
The tolerance is ``10`` noise floors, because the spread is the largest difference seen in a
couple of clean runs, and a resharded run that crosses several world sizes may legitimately land
a few times beyond it; real state bugs measured here are 10^4-10^6 floors away. Without a
measured spread, anything beyond float rounding is ``unknown``.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from pytest_reshard.checkers._text import _fault_before, _ranges
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History, Occurrence
from pytest_reshard.verdict import Verdict

#: A deviation beyond this many noise floors fails loss_continuity.
SPREAD_FACTOR = 10.0
#: The smallest noise floor, relative to |loss|: about one float32 rounding (eps = 1.19e-7).
ROUNDING_FLOOR = 1e-7


class _Row(NamedTuple):
    """One compared step: its deviation in noise floors, and the values behind it."""

    units: float
    step: int
    occ: Occurrence
    loss: float
    ref: float

    @classmethod
    def of(cls, step: int, occ: Occurrence, loss: float, ref: float,
           spread: float | None) -> "_Row":
        floor = max(spread or 0.0, ROUNDING_FLOOR * abs(ref), 1e-30)
        return cls(abs(loss - ref) / floor, step, occ, loss, ref)


def measure_spread(reference_a: History, reference_b: History, *more: History) -> float:
    """The noise floor: the largest per-step loss difference between clean runs.

    Pass clean runs of the same seed and data at *different* world sizes; the largest difference
    over every pair and every step both kept is what reduction order alone can do.
    """
    runs = [reference_a, reference_b, *more]
    losses = [{s: loss for s, (_, loss) in r.kept_losses().items()} for r in runs]
    spread = 0.0
    for i in range(len(runs)):
        for j in range(i + 1, len(runs)):
            common = set(losses[i]) & set(losses[j])
            if not common:
                raise ValueError(f"reference runs {i} and {j} share no step with a recorded loss; "
                                 "record s.record(loss=...) in every step of both")
            spread = max(spread, max(abs(losses[i][s] - losses[j][s]) for s in common))
    return spread


def loss_continuity(history: History, *, reference: History | None = None,
                    spread: float | None = None) -> Verdict:
    """Per-step loss of the kept steps matches a clean reference within the measured noise floor."""
    check, replay = "loss_continuity", history.replay
    if spread is not None and (math.isnan(spread) or spread < 0):
        raise ValueError(f"spread must be a measured loss difference >= 0, got {spread!r}")
    if reference is None:
        return Verdict.unknown(check, "no reference run to compare with: pass reference=History "
                               "of a fault-free run with the same seed and data order",
                               replay=replay)
    ref = {s: loss for s, (_, loss) in reference.kept_losses().items()}
    run = history.kept_losses()
    if not ref:
        return Verdict.unknown(check, "the reference run recorded no loss; call "
                               "s.record(loss=loss.item()) in every step", replay=replay)
    if not run:
        return Verdict.unknown(check, "the run recorded no loss for any kept step; call "
                               "s.record(loss=loss.item()) in every step", replay=replay)
    last = max(run)
    gaps = sorted(s for s in ref if s not in run and s <= last)
    tail = sorted(s for s in ref if s > last)
    rows = [_Row.of(s, run[s][0], run[s][1], ref[s], spread) for s in sorted(set(ref) & set(run))]
    if not rows:
        return Verdict.unknown(check, f"the run (steps {_ranges(run)}) and the reference (steps "
                               f"{_ranges(ref)}) share no step with a loss", replay=replay)
    floor_note = (f"noise floor max(spread {spread:.3g}, {ROUNDING_FLOOR:g}*|loss|)"
                  if spread is not None else
                  f"no measured spread: noise floor {ROUNDING_FLOOR:g}*|loss| (float rounding)")
    details: dict[str, Any] = {
        "spread": spread, "factor": SPREAD_FACTOR, "compared": len(rows), "missing": gaps,
        "not_reached": tail, "deviations": {r.step: r.loss - r.ref for r in rows}}
    worst = max(rows, key=lambda r: (r.units, -r.step))   # the earliest of equal deviations
    if worst.units > SPREAD_FACTOR:
        # Name where the loss first departs: a departure at a resume point is the classic
        # reshard bug even when the deviation grows larger later (optimizer moments, drift).
        first = next(r for r in rows if r.units > SPREAD_FACTOR)
        s, occ = first.step, first.occ
        gen = history.generations.get(occ.gen)
        resume = gen.resume_step if gen and occ.gen != min(history.generations) else None

        def dev(r: _Row) -> str:
            return (f"{r.loss:.6g} vs reference {r.ref:.6g} (off by {abs(r.loss - r.ref):.3g}), "
                    f"{r.units:.3g}x the noise floor")

        if resume == s:
            text = f"loss spike at resume point step {s} (generation {occ.gen}): {dev(first)}"
        elif resume is not None:
            text = (f"loss departs from the reference at step {s} (generation {occ.gen}, "
                    f"{s - resume} step{'s' if s - resume != 1 else ''} after the resume at step "
                    f"{resume}): {dev(first)}")
        else:
            text = f"loss departs from the reference at step {s} (generation {occ.gen}): {dev(first)}"
        if worst.step != s:
            text += f"; worst at step {worst.step} (generation {worst.occ.gen}): {dev(worst)}"
        where = dict(step=s, generation=occ.gen, fault=_fault_before(history, occ.gen),
                     details=details, replay=replay)
        if spread is None:
            return Verdict.unknown(check, f"{text}; {floor_note}, so reduction-order noise "
                                   "cannot be told from a bug: pass spread=measure_spread(a, b) of "
                                   "clean runs at different world sizes", **where)
        return Verdict.failed(check, f"{text} (tolerance {SPREAD_FACTOR:g}x, {floor_note}); the "
                              "resumed state differs from the saved one (optimizer moments, LR "
                              "schedule, data position or RNG): see state_equivalence", **where)
    if gaps:
        return Verdict.failed(check, f"no loss for kept steps {_ranges(gaps)} although the reference "
                              f"has them and the run went on to step {last}: they were skipped or "
                              "their loss was not recorded", step=gaps[0], details=details,
                              replay=replay)
    summary = (f"{len(rows)} steps within {SPREAD_FACTOR:g} noise floors of the reference"
               + (f" (worst {worst.units:.3g}x at step {worst.step})" if worst.units > 0
                  else " (identical losses)")
               + f"; {floor_note}")
    if tail:
        return Verdict.unknown(check, f"the run stopped at step {last}: steps {_ranges(tail)} were "
                               f"never compared; {summary}", step=last + 1, details=details,
                               replay=replay)
    return Verdict.passed(check, summary, details=details, replay=replay)


@register("loss_continuity", column="loss", assertion="assert_loss_continuous",
          description="each kept step's loss is within 10 noise floors of a clean run's (the "
                      "floor measured between clean runs at two world sizes)")
def _check(ctx: CheckContext) -> Verdict:
    """Against the session's clean run at the first topology, with the spread to a clean run at
    a second topology; unknown, with the reason, when a clean run did not finish."""
    clean = ctx.clean_runs()
    if clean.broken:
        return Verdict.unknown("loss_continuity", clean.broken)
    spread = (measure_spread(clean.reference, clean.second)
              if clean.reference is not None and clean.second is not None else None)
    return loss_continuity(ctx.history, reference=clean.reference, spread=spread)
