"""one_step_checkpoint: every checkpoint a resume loaded holds one step, the step it was saved at."""
from __future__ import annotations

from pytest_reshard.checkers._text import _count
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import LOAD, STATE, Checkpoint, History
from pytest_reshard.verdict import Verdict

CHECK = "one_step_checkpoint"


def _steps_held(load: Checkpoint, live: list[Checkpoint]) -> dict[str, set[int]]:
    """Per loaded component recorded live before the load: the steps whose live state it equals
    (empty when it equals none of them)."""
    held: dict[str, set[int]] = {}
    for name, value in load.digest.items():
        seen = [s for s in live if s.index < load.index and name in s.digest]
        if seen:
            held[name] = {s.step for s in seen if s.digest[name] == value}
    return held


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _label(steps: set[int]) -> str:
    return "step " + " or ".join(str(s) for s in sorted(steps))


def one_step_checkpoint(history: History) -> Verdict:
    """Every component a resume loaded equals the live state after the step it was saved at, as
    the ranks recorded it after each step (``Run.state_after``). A save that copies the state
    while training goes on (an asynchronous writer handed live tensors, a data state taken one
    call later than the model) writes a later step's weights under the counters of the step it
    claims, and the load cannot tell: the check names the step each component holds."""
    never = history.never_started()
    if never is not None:
        return Verdict.unknown(CHECK, never)
    live = history.checkpoints(STATE)
    if not live:
        return Verdict.unknown(
            CHECK, "no live state was recorded, so the step a checkpoint holds cannot be named: "
                   "call run.state_after(step, state={...}) after each step's update, with the "
                   "components a save holds")
    loads = [c for c in history.checkpoints(LOAD) if c.digest]
    if not loads:
        return Verdict.passed(CHECK, "no checkpoint was loaded back")
    judged, mixed, unmatched = 0, [], set()
    for load in loads:
        held = _steps_held(load, live)
        unmatched |= {name for name, steps in held.items() if not steps}
        held = {name: steps for name, steps in held.items() if steps}
        judged += bool(held)
        if any(load.step not in steps for steps in held.values()):
            mixed.append((load, held))
    note = (f"; {_join(sorted(unmatched))} matched no step's live state (not judged here)"
            if unmatched else "")
    if not judged:
        return Verdict.unknown(CHECK, f"no loaded component matched a live state of any step{note}")
    details = {"mixed": [[c.gen, c.rank, c.step, {n: sorted(s) for n, s in h.items()}]
                         for c, h in mixed]}
    if not mixed:
        return Verdict.passed(CHECK, f"{_count(judged, 'load')} held the step each was saved at, "
                                     f"component by component{note}")
    load, held = mixed[0]
    groups: dict[str, list[str]] = {}
    for name, steps in sorted(held.items()):
        groups.setdefault(_label({load.step} if load.step in steps else steps), []).append(name)
    where = (f"the checkpoint of step {load.step} that rank {load.rank} loaded in generation "
             f"{load.gen}")
    if len(groups) == 1:
        (label, names), = groups.items()
        text = (f"{where} holds {label} ({_join(names)}), not the step it was saved at: the save "
                f"copied the state after training went on (an asynchronous writer given live "
                f"tensors)")
    else:
        parts = [f"{_join(names)} of {label}" for label, names in groups.items()]
        text = (f"{where} mixes steps: {'; '.join(parts)}. A save must copy every component at "
                f"one step: an asynchronous writer given live tensors writes them as training "
                f"updates them, and a component saved by a call of its own (a data loader's "
                f"state beside the model's) may be taken a step apart")
    if len(mixed) > 1:
        text += f" ({len(mixed)} loads in all)"
    return Verdict.failed(CHECK, text + note, step=load.step, rank=load.rank,
                          generation=load.gen, details=details)


@register(CHECK, column="1-step", applies=lambda ctx: bool(ctx.history.checkpoints(STATE)),
          when="the ranks record their live state after each step (run.state_after)",
          description="every loaded checkpoint holds the state of one step, the step it was "
                      "saved at")
def _check(ctx: CheckContext) -> Verdict:
    return one_step_checkpoint(ctx.history)
