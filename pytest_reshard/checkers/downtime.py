"""downtime: a handover in the running processes (a live reshard, a migration) pauses training
for the swap alone.

A handover's ranks ask for it (``run.live_reshard``) after some step; the swap comes after the
same step (a live reshard) or, for a migration, after the joiner holds the whole shard, some
steps on. Two figures, each in median steps outside the handover (the old world's before the ask
and the new world's after its first step, which pays for its warm-up):

- the **stall**: the longest gap between two step ends (the last rank's) from the ask to the
  swap, less the checkpoint saves the ranks recorded in it (``seconds``). The shard moves while
  training goes on, so each gap should look like a step: a joiner awaited or a shard copied while
  every rank waits shows here. At most ``max_stall_steps`` (2).
- the **pause**: the swap's own gap, from the old world's last step end to the new world's
  first. It re-forms the process group, rebuilds the model and pays the new world's first step
  (a live reshard moves the shards in it too): a fixed cost, several steps of a model as small
  as the bundled LM's, a fraction of a step of a real one. At most ``max_pause_steps`` (10), or
  ``MIN_PAUSE_S`` (1 s) where that is longer: re-forming a group alone can take half a second on
  a busy machine, whatever the step.

A save whose duration the workload did not record counts as a stall: it can fail a correct run,
never pass a wrong one.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.contract import Ev
from pytest_reshard.history import SAVE, History
from pytest_reshard.verdict import Verdict

CHECK = "downtime"
#: The longest gap between two step ends while a handover is prepared, in median steps.
MAX_STALL_STEPS = 2.0
#: The longest the swap itself may take, from the old world's last step end to the new world's
#: first, in median steps.
MAX_PAUSE_STEPS = 10.0
#: A swap this short is no stall on any model: it fails only past both bounds.
MIN_PAUSE_S = 1.0
MIN_BASELINE_STEPS = 3  # step gaps outside the handover that make a median


@dataclass(frozen=True)
class Handover:
    """Generation ``gen`` -> ``gen + 1``, asked after step ``asked``, swapped after ``swapped``."""

    gen: int
    asked: int
    swapped: int
    moved: int | None    # the rank whose shard went to a new process (a migration)
    median: float        # seconds: the median step outside the handover
    pause: float         # seconds: the swap's gap
    stall: float         # seconds: the longest gap from the ask to the swap, less saves (0: none)
    stall_step: int | None  # the step that gap ends with

    def steps(self, seconds: float) -> float:
        return seconds / self.median if self.median > 0 else float("inf")

    def said(self) -> str:
        what = (f"the migration of rank {self.moved}'s shard" if self.moved is not None
                else "the handover")
        return f"{what} in generation {self.gen} (asked after step {self.asked})"


def handovers(history: History) -> list[int]:
    """The generations that ended handing their processes on to the next (in place)."""
    return [e["gen"] for e in history.supervisor_events(Ev.GEN_END) if e.get("live")]


def _last_ends(history: History, gen: int) -> dict[int, float]:
    """step -> when its last rank ended it, for the steps every rank of ``gen`` ended."""
    g = history.generations[gen]
    out = {}
    for step in sorted(history.ended(gen)):
        ends = history.end_times(gen, step)
        if len(ends) == g.world_size:
            out[step] = max(ends.values())
    return out


def _save_seconds(history: History, gen: int) -> dict[int, float]:
    """step -> the longest a rank said it spent saving after it (a handover's own record of
    the state it hands on, ``source="live"``, is the swap: not a save)."""
    out: dict[int, float] = {}
    for c in history.checkpoints(SAVE, gen=gen):
        if c.seconds is not None and c.info.get("source") != "live":
            out[c.step] = max(out.get(c.step, 0.0), c.seconds)
    return out


def measure(history: History, gen: int) -> Handover | str:
    """``gen``'s handover, or why it cannot be measured."""
    asked = sorted({e["step"] for e in history.rank_events(Ev.LIVE, gen=gen)})
    if not asked:
        return f"generation {gen} handed over without its ranks asking (run.live_reshard)"
    before, after = _last_ends(history, gen), _last_ends(history, gen + 1)
    if not after:
        return f"generation {gen + 1} ended no step after the handover"
    if asked[0] not in before:
        return f"the ranks of generation {gen} asked for a handover after step {asked[0]}, " \
               "which not all of them ended"
    saves = _save_seconds(history, gen), _save_seconds(history, gen + 1)
    steady = [g for g, _ in _gaps(before, saves[0], [s for s in sorted(before) if s <= asked[0]][1:])
              + _gaps(after, saves[1], sorted(after)[1:])]  # a first step pays its warm-up
    if len(steady) < MIN_BASELINE_STEPS:
        return (f"the handover of generation {gen} after step {asked[0]} has {len(steady)} steady "
                f"steps around it; {MIN_BASELINE_STEPS} make the median step it is measured in")
    swapped, first = max(before), min(after)
    stall, stall_step = max(_gaps(before, saves[0], [s for s in before if s >= asked[0]]),
                            default=(0.0, None))
    return Handover(gen, asked[0], swapped, history.replaced(gen), statistics.median(steady),
                    after[first] - before[swapped], stall, stall_step)


def _gaps(ends: dict[int, float], saves: dict[int, float],
          steps: list[int]) -> list[tuple[float, int]]:
    """(seconds, the later step) for consecutive steps among ``steps``: the gap between their
    ends, less the save between them."""
    steps = sorted(steps)
    return [(ends[b] - ends[a] - saves.get(a, 0.0), b) for a, b in zip(steps, steps[1:])
            if b == a + 1]


def downtime(history: History, *, max_stall_steps: float = MAX_STALL_STEPS,
             max_pause_steps: float = MAX_PAUSE_STEPS) -> Verdict:
    """Every handover in the running processes stalled no step while it was prepared longer than
    ``max_stall_steps`` median steps, and paused training for its swap at most
    ``max_pause_steps``."""
    gens = handovers(history)
    if not gens:
        return Verdict.unknown(CHECK, "no handover in the running processes (a live reshard or "
                               "a migration) to judge")
    done: list[Handover] = []
    unknown: list[str] = []
    for gen in gens:
        got = measure(history, gen)
        if isinstance(got, Handover):
            done.append(got)
        else:
            unknown.append(got)
    for h in done:
        if h.steps(h.stall) > max_stall_steps:
            return Verdict.failed(
                CHECK, f"{h.said()}: the step ending at step {h.stall_step} took {h.stall:.3f} s, "
                       f"{h.steps(h.stall):.1f} median steps of {h.median:.3f} s, while the "
                       f"handover was prepared (at most {max_stall_steps:g}): every rank waited "
                       "for it; move the shard while training goes on and swap at a step boundary",
                rank=h.moved, step=h.stall_step, generation=h.gen)
        if h.steps(h.pause) > max_pause_steps and h.pause > MIN_PAUSE_S:
            return Verdict.failed(
                CHECK, f"{h.said()}: the swap after step {h.swapped} paused training "
                       f"{h.pause:.3f} s, {h.steps(h.pause):.1f} median steps of {h.median:.3f} s "
                       f"(at most {max_pause_steps:g}, or {MIN_PAUSE_S:g} s): a swap should "
                       "re-form the group and rebuild the model, with the shard already in place",
                rank=h.moved, step=h.swapped, generation=h.gen)
    if unknown:
        return Verdict.unknown(CHECK, "; ".join(str(u) for u in unknown))
    said = "; ".join(
        f"{h.said()}: swapped after step {h.swapped}, a pause of {h.pause:.3f} s "
        f"({h.steps(h.pause):.1f} median steps of {h.median:.3f} s)"
        + (f", no step while it was prepared longer than {h.steps(h.stall):.1f}"
           if h.stall_step is not None else "") for h in done)
    return Verdict.passed(CHECK, f"{said}; at most {max_pause_steps:g} (or {MIN_PAUSE_S:g} s) "
                                 f"for the swap, {max_stall_steps:g} while it is prepared")


@register(CHECK, column="pause", assertion="assert_no_long_pause",
          applies=lambda ctx: bool(handovers(ctx.history)),
          when="a generation handed its processes on (a live reshard, a migration)",
          description="while a handover is prepared no step takes longer than max_stall_steps (2) "
                      "median steps; its swap pauses training at most max_pause_steps (10) or 1 s")
def _check(ctx: CheckContext) -> Verdict:
    if ctx.scenario is None:
        return downtime(ctx.history)
    return downtime(ctx.history, max_stall_steps=ctx.scenario.max_stall_steps,
                    max_pause_steps=ctx.scenario.max_pause_steps)
