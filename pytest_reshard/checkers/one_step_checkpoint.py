"""one_step_checkpoint: every checkpoint saved or loaded holds one step, the step it was saved at."""
from __future__ import annotations

from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import LOAD, SAVE, STATE, Checkpoint, History
from pytest_reshard.verdict import Verdict

CHECK = "one_step_checkpoint"


def _steps_held(load: Checkpoint, live: list[Checkpoint]) -> dict[str, set[int]]:
    """Per component of a save or load recorded live before it: the steps whose live state it
    equals (empty when it equals none of them)."""
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
    """Every component a save recorded (``checkpoint_saved``: what it wrote) and a resume loaded
    equals the live state after the step it was saved at, as the ranks recorded it after each
    step (``Run.state_after``). A save that copies the state while training goes on (an
    asynchronous writer handed live tensors, a data state taken one call later than the model)
    writes a later step's weights under the counters of the step it claims, and the load cannot
    tell: the check names the step each component holds."""
    never = history.never_started()
    if never is not None:
        return Verdict.unknown(CHECK, never)
    live = history.checkpoints(STATE)
    if not live:
        return Verdict.unknown(
            CHECK, "no live state was recorded, so the step a checkpoint holds cannot be named: "
                   "call run.state_after(step, state={...}) after each step's update, with the "
                   "components a save holds")
    records = [c for c in history.checkpoints(SAVE) + history.checkpoints(LOAD) if c.digest]
    if not records:
        return Verdict.unknown(CHECK, "no save or load recorded digests of what it wrote or "
                                      "read, so there is nothing to hold against the live state: "
                                      "pass state= to checkpoint_saved and checkpoint_loaded")
    judged, mixed, unmatched = 0, [], set()
    for record in sorted(records, key=lambda c: (c.gen, c.step, c.rank, c.kind != LOAD)):
        held = _steps_held(record, live)
        unmatched |= {name for name, steps in held.items() if not steps}
        held = {name: steps for name, steps in held.items() if steps}
        judged += bool(held)
        if any(record.step not in steps for steps in held.values()):
            mixed.append((record, held))
    if not mixed and unmatched:
        return Verdict.unknown(
            CHECK, f"{_join(sorted(unmatched))} of a save or load matched no step's live state, "
                   "so the step it holds cannot be named: digest the same objects in "
                   "state_after as in the save (the bare model, not a DDP wrapper whose keys "
                   "start with `module.`), on every rank that saves or loads")
    if not judged:
        return Verdict.unknown(CHECK, "no save or load recorded after a live state of the same "
                                      "components, so none could be judged")
    details = {"mixed": [[c.kind, c.gen, c.rank, c.step, {n: sorted(s) for n, s in h.items()}]
                         for c, h in mixed]}
    if not mixed:
        which = "the one save or load judged" if judged == 1 else \
            f"all {judged} saves and loads judged"
        return Verdict.passed(CHECK, f"{which} held the step each was saved at, component by "
                                     "component")
    record, held = mixed[0]
    groups: dict[str, list[str]] = {}
    for name, steps in sorted(held.items()):
        groups.setdefault(_label({record.step} if record.step in steps else steps), []).append(name)
    verb = "loaded" if record.kind == LOAD else "saved"
    where = (f"the checkpoint of step {record.step} that rank {record.rank} {verb} in "
             f"generation {record.gen}")
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
        text += f". {len(mixed)} saves and loads in all hold another step"
    if unmatched:
        text += f"; {_join(sorted(unmatched))} matched no step's live state (not judged)"
    return Verdict.failed(CHECK, text, step=record.step, rank=record.rank,
                          generation=record.gen, details=details)


@register(CHECK, column="1-step", applies=lambda ctx: bool(ctx.history.checkpoints(STATE)),
          when="the ranks record their live state after each step (run.state_after)",
          description="every checkpoint saved or loaded holds the state of one step, the step "
                      "it was saved at")
def _check(ctx: CheckContext) -> Verdict:
    return one_step_checkpoint(ctx.history)
