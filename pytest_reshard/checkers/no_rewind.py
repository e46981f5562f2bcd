"""no_rewind: a rewind is a committed step executed again.

At each generation change the cost is the number of committed steps still in effect that the new
generation's resume step throws away (a step discarded once is not charged again). Planned
transitions (a reshard with notice, a SIGTERM preemption) may cost 0; unplanned ones at most
``max_rewind_steps`` (undeclared: 0). Resuming *past* steps that never ran is flagged too.

In membership mode (one replica group restarted inside a generation) a rewind is an attempt
that began after its step was committed by the quorum and ended (``History.replays``): each
restarted incarnation may replay at most ``max_rewind_steps`` committed steps.
"""
from __future__ import annotations

from typing import Any

from pytest_reshard.checkers._text import (_advice, _cause_phrase, _count, _fault_before, _ranges,
                                          _summarise)
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import Generation, History
from pytest_reshard.verdict import Verdict


def no_rewind(history: History) -> Verdict:
    """No committed step is executed again beyond the budget, and no step is skipped."""
    check = "no_rewind"
    if not history.generations:
        return Verdict.unknown(check, "the history has no generation: no rank recorded anything; "
                               "does the workload call probe.attach()?")
    never = history.never_started()
    if never is not None:
        return Verdict.unknown(check, never)
    live_committed: set[int] = set()   # committed steps whose effect is still in the state
    live_ended: set[int] = set()       # steps some rank finished, still in the state
    live_begun: dict[int, int] = {}    # step -> the last generation that began it (in the lineage)
    pending: list[Generation] = []     # generations ended since the last one that resumed
    problems: list[dict[str, Any]] = []
    transitions: list[dict[str, Any]] = []
    for g in sorted(history.generations):
        gen = history.generations[g]
        resume = gen.resume_step
        if resume is None:              # never got as far as resuming: nothing changed
            pending.append(gen)
            continue
        began = history.begun(g)
        replayed = sorted({s for s in live_committed if s >= resume} | (live_committed & began))
        if pending:                     # a transition: the generations in `pending` ended
            planned = all(p.planned for p in pending)
            culprit = next((p for p in pending if not p.planned), pending[-1])
            # What the failed generation promised counts too: a pipeline that declared 0 (its
            # drafters replicate the state) and came back smaller must still have lost nothing.
            declared = min([history.max_rewind_steps(p.gen) for p in pending]
                           + [history.max_rewind_steps(g)])
            budget = 0 if planned else declared
            fault = history.describe_fault(culprit.fault_id)
            cause = _cause_phrase(history, culprit)
            transitions.append({"generation": g, "resume_step": resume, "planned": planned,
                                "replayed": replayed, "budget": budget, "fault": fault})
            if len(replayed) > budget:
                advice = _advice(history, check)
                if advice:
                    hint = advice
                elif planned:
                    hint = ("a planned reshard or preemption must cost nothing: save when "
                            "run.reshard_requested() or run.stop_requested() says so, and resume "
                            "from that save at the next step")
                elif declared == 0:
                    hint = ("the workload's rewind budget is 0 (declared so, or unset): declare its "
                            "checkpoint interval with probe.attach(max_rewind_steps=N) or keep "
                            "redundant in-memory state that survives this fault")
                else:
                    hint = (f"the workload declares max_rewind_steps={budget}: checkpoint more "
                            "often, or resume from the latest save")
                problems.append({
                    "message": f"generation {g} resumed at step {resume} after {cause}: committed "
                               f"steps {_ranges(replayed)} replayed ({len(replayed)} steps, "
                               f"budget {budget}); {hint}",
                    "step": resume, "generation": g, "fault": fault})
        last = max(live_ended, default=-1)
        if resume > last + 1:
            problems.append({
                "message": _skipped(history, g, resume, last, live_begun),
                "step": resume, "generation": g, "fault": _fault_before(history, g)})
        live_committed = {s for s in live_committed if s < resume and s not in began}
        live_committed |= history.committed(g)
        live_ended = {s for s in live_ended if s < resume} | history.ended(g)
        live_begun = {s: gg for s, gg in live_begun.items() if s < resume}
        live_begun.update({s: g for s in began})
        pending = [gen]
    members = _membership(history, problems)
    details = {"transitions": transitions, "problems": [p["message"] for p in problems],
               "member_restarts": members}
    if problems:
        first = problems[0]
        return Verdict.failed(check, _summarise([p["message"] for p in problems]),
                              step=first["step"], generation=first["generation"],
                              fault=first["fault"], details=details)
    if members:
        text = "; ".join(f"generation {m['generation']}: {_count(m['restarts'], 'group restart')}, "
                         + (f"{len(m['replayed'])} committed steps replayed within budget "
                            f"{m['budget']} ({_ranges(m['replayed'])})" if m["replayed"]
                            else "no committed step executed again") for m in members)
        if transitions:
            text += f"; {_count(len(transitions), 'generation transition')} within budget"
        return Verdict.passed(check, f"membership: {text}", details=details)
    if not transitions:
        return Verdict.passed(check, "no generation resumed after another: nothing replayed",
                              details=details)
    lost = [t for t in transitions if t["replayed"]]
    if lost:
        text = ", ".join(f"generation {t['generation']} replayed {len(t['replayed'])} of "
                         f"budget {t['budget']}" for t in lost)
        return Verdict.passed(check, f"{_count(len(transitions), 'generation transition')}, "
                                     f"rewinds within budget: {text}", details=details)
    return Verdict.passed(check, f"{_count(len(transitions), 'generation transition')} replayed no "
                                 "committed step", details=details)


def _membership(history: History, problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Membership generations: the committed steps each restarted incarnation executed again,
    against the budget; a problem per incarnation over it."""
    out = []
    for g in sorted(history.generations):
        restarts, replays = history.member_restarts(g), history.replays(g)
        split = history.split_commits(g)
        if split:
            step, quorums = next(iter(split.items()))
            sides = " and ".join(f"group{'s' if len(gs) > 1 else ''} "
                                 f"{', '.join(map(str, sorted(gs)))} in quorum {q}"
                                 for q, gs in sorted(quorums.items()))
            problems.append({
                "message": f"generation {g}: step {step} was committed by {sides} "
                           f"({_count(len(split), 'step')} in all: {_ranges(sorted(split))}): "
                           "two quorums committed the same steps, each with its own state (a "
                           "split brain); a quorum must need a majority of the replica groups",
                "step": step, "generation": g, "fault": _fault_before(history, g)})
        if not restarts and not replays:
            continue
        budget = history.max_rewind_steps(g)
        by_incarnation: dict[tuple[int, int], set[int]] = {}
        for r in replays:
            by_incarnation.setdefault((r.rank, r.incarnation), set()).add(r.step)
        for (rank, inc), steps in sorted(by_incarnation.items()):
            if len(steps) > budget:
                first = min(steps)
                problems.append({
                    "message": f"generation {g}, rank {rank} (incarnation {inc}): committed steps "
                               f"{_ranges(sorted(steps))} executed and ended again after the "
                               f"quorum had committed them ({len(steps)} steps, budget {budget}); "
                               "a group that rejoins a live quorum must take the quorum's state "
                               "(heal from a peer) instead of training from an older one",
                    "step": first, "generation": g, "fault": _fault_before(history, g)})
        out.append({"generation": g, "restarts": len(restarts), "budget": budget,
                    "replayed": sorted({r.step for r in replays})})
    return out


_SAVE_PHASES = ("checkpoint", "checkpoint_commit")


def _skipped(history: History, g: int, resume: int, last: int, begun: dict[int, int]) -> str:
    """Generation ``g`` resumed past steps that never finished: what happened to them. A step
    that began and never ended was in flight when its generation died; a load of it means the
    resume read a checkpoint that was visible before its commit point."""
    before = (f"the last step finished before was {last}" if last >= 0
              else "no step had finished before")
    skipped = list(range(last + 1, resume))
    in_flight = [s for s in skipped if s in begun]
    if not in_flight:
        return (f"generation {g} resumed at step {resume} but {before}: steps {_ranges(skipped)} "
                "were never run; the resume step must be the saved step + 1")
    s = in_flight[-1]
    died = begun[s]
    loads = [c for c in history.checkpoints("load", gen=g) if c.step == s]
    saved = [c for c in history.checkpoints("save") if c.step == s and c.gen < g]
    at_save = [f for f in history.faults_fired()
               if f.gen == died and f.step == s and f.phase in _SAVE_PHASES]
    never = [x for x in skipped if x not in begun]
    also = f"; steps {_ranges(never)} were never run" if never else ""
    if at_save or (loads and not saved):
        f = at_save[0] if at_save else None
        how = (f"generation {died} was killed in step {s} at its {f.phase} point "
               f"({history.describe_fault(f.id) or f.kind}, rank {f.rank}), before the step "
               "ended" if f else f"step {s} never ended in generation {died}")
        what = (f"no save of step {s} was recorded as completed (run.checkpoint_saved)"
                if not saved else f"step {s} never finished")
        return (f"generation {g} resumed at step {resume} from the state of step {s}, but {how} "
                f"and {what}: the resume read a checkpoint that was visible before its commit "
                "point; write the checkpoint under a temporary name and rename it into place "
                "(os.replace) once every rank's part is written, or write a commit marker last "
                f"and load only committed checkpoints{also}")
    return (f"generation {g} resumed at step {resume} but {before}: step {s} began in "
            f"generation {died} and never finished (it was in flight when that generation "
            f"ended), so its effect cannot be in any complete checkpoint; resume from the last "
            f"finished step + 1{also}")


@register("no_rewind", column="rewind", assertion="assert_no_rewind",
          description="no committed step is executed again beyond the rewind budget (0 for "
                      "planned reshards and preemptions), and no step is skipped")
def _check(ctx: CheckContext) -> Verdict:
    return no_rewind(ctx.history)
