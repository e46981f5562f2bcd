"""liveness: the run finished, and nothing died, hung or went silent unexplained.

The final generation committed the last step; every death, stop or stall is explained by a
scheduled fault (or, for a death, by the workload's own check that caught corrupted state first:
``run.detected``); every scheduled fault fired and was made (an injector that could not make its
fault says so: ``NOT_INJECTED``); every rank started; no rank kept training after a preemption's
SIGTERM. A run that never began a step is said once, here, with the end of the
failing rank's log; the other checkers say ``unknown`` ("the run never started"). A workload whose
clean reference run fails is a failure of the workload, said first.
"""
from __future__ import annotations

import dataclasses
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_reshard.checkers._text import _log_hint, _log_tail, _ranges, _stack, _summarise
from pytest_reshard.checkers.registry import register
from pytest_reshard.contract import GUARD, NOT_INJECTED, PREEMPT_SIGNAL, Cause, Detected, FileOp
from pytest_reshard.history import Begun, Detection, Ended, FaultFired, History, Signal, Started
from pytest_reshard.verdict import FAIL, PASS, Verdict

if TYPE_CHECKING:  # the context asks liveness whether a clean run finished
    from pytest_reshard.checkers.context import CheckContext


def _at(d: Detection) -> str:
    return (f"at step {d.step}, phase {d.phase}" if d.step is not None and d.phase
            else f"at step {d.step}" if d.step is not None else "before its first step")


def _code(d: Detection) -> str:
    if d.exit_code is None:
        return ""
    return f" (killed by signal {-d.exit_code})" if d.exit_code < 0 else f" (exit code {d.exit_code})"


def _what(d: Detection) -> str:
    """``rank 1 died (exit code 1) at step 4, phase backward``."""
    who = f"rank {d.rank}" if d.rank is not None else "a rank"
    at, code = _at(d), _code(d)
    words: dict[str, str] = {
        Detected.DIED: f"{who} died{code} {at}",
        Detected.STOPPED: f"{who} stopped responding {at}",
        Detected.STALLED: f"{who} stalled {at}: alive, but no progress",
        Detected.EXITED_EARLY: f"{who} exited early{code} {at}, before the run finished",
        Detected.OOM: d.detail or f"{who} exceeded its memory budget {at}",
        Detected.PARTITIONED: f"{who} was partitioned {at} (its node cut off the network)",
    }
    return words.get(d.kind, f"{who} {d.kind} {at}")


def _describe_detection(d: Detection, history: History, run_dir: Path | None = None, *,
                        log: bool = False, stacks: Path | None = None) -> str:
    """``stacks``: the run folder whose logs hold a stalled rank's stack dump."""
    tail = "" if d.rank is None else _log_tail(run_dir, d.gen, d.rank) if log else \
        _log_hint(run_dir, d.gen, d.rank)
    if d.kind == Detected.STALLED and d.rank is not None:
        tail = _stack(stacks or run_dir, d.gen, d.rank) + tail
    fired = [f for f in history.faults_fired() if f.gen == d.gen and f.rank == d.rank]
    if not fired:
        return f"{_what(d)} (generation {d.gen}), and no scheduled fault explains it{tail}"
    f = fired[-1]
    why = f"after the scheduled {history.describe_fault(f.id) or f.kind} fired on it"
    refused = [n for n in history.notes(NOT_INJECTED, gen=d.gen) if n.rank == d.rank]
    if refused:
        why += f", which could not be injected: {refused[-1].fields.get('reason')}"
    elif d.kind == Detected.STALLED:
        why += (", which the job did not notice within the scenario's stall_s: its collectives "
                "must time out sooner (or raise stall_s for a job that waits longer on purpose)")
    else:
        why += ", which does not explain this death"
    return f"{_what(d)} (generation {d.gen}), {why}{tail}"


def _short(d: Detection) -> str:
    """``rank 2 exited at step 15``: a detection in a few words."""
    where = f"at step {d.step}" if d.step is not None else "before its first step"
    verbs: dict[str, str] = {Detected.DIED: f"died{_code(d)}", Detected.EXITED_EARLY: "exited",
                             Detected.STOPPED: "stopped responding", Detected.STALLED: "stalled",
                             Detected.OOM: "passed its memory budget",
                             Detected.PARTITIONED: "was partitioned"}
    verb = verbs.get(d.kind, d.kind)
    return f"rank {d.rank} {verb} {where}"


def _never_started_problem(history: History, run_dir: Path | None) -> dict[str, Any]:
    """The one problem of a run in which no rank began a step: who failed, how, and its log."""
    unexpected = sorted((d for d in history.detections() if not d.expected),
                        key=lambda d: d.t or 0.0)
    first = min(history.generations)
    starts = history.starts(first)
    if unexpected:
        d = unexpected[0]
        attached = d.rank in history.starts(d.gen)
        when = ("after probe.attach(), in its setup (init_process_group, loading data or a "
                "checkpoint)" if attached else "before it called probe.attach(): a syntax error, "
                "an exception at import, or a script that never attaches")
        who = f"rank {d.rank}" if d.rank is not None else "a rank"
        verbs: dict[str, str] = {
            Detected.DIED: f"died{_code(d)}", Detected.EXITED_EARLY: f"exited{_code(d)}",
            Detected.STOPPED: "stopped responding", Detected.STALLED: "stalled (no progress)",
            Detected.OOM: "passed its memory budget"}
        verb = verbs.get(d.kind, d.kind)
        text = (f"the run never started: {who} {verb} before its first step, {when} "
                f"(generation {d.gen}){_log_tail(run_dir, d.gen, d.rank) if d.rank is not None else ''}")
        return {"message": text, "step": None, "rank": d.rank, "generation": d.gen,
                "fault": None}
    gen = history.generations[first]
    world = gen.world_size
    missing = [r for r in range(world) if r not in starts]
    if missing:
        who = (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never "
               "called probe.attach() (still importing, blocked before attaching, or a script "
               "that never attaches)")
        rank = missing[0]
    else:
        who = ("every rank attached (probe.attach()) but none began a step: blocked in setup "
               "(init_process_group waiting for a peer, loading data or a checkpoint)")
        rank = 0
    ended = history.final_generation
    how = (f"generation {ended.gen} ended by {ended.cause}{': ' + ended.detail if ended.detail else ''}"
           if ended is not None and ended.cause else "no generation end was recorded")
    text = f"the run never started: {who}; {how}{_log_tail(run_dir, first, rank)}"
    return {"message": text, "step": None, "rank": rank, "generation": first, "fault": None}


def _preempt_kinds() -> set[str]:
    from pytest_reshard.schedule import kinds

    out = {"preempt"}
    for name in kinds.registered():
        if kinds.get(name).cause is Cause.PREEMPT:
            out.add(name)
    return out


def _trained_alone(history: History) -> list[dict[str, Any]]:
    """Ranks that ended steps no peer of their role ended, more than one past the last step they
    all ended. In a fixed world a step needs every rank's collectives, so a rank that goes on
    alone swallowed the error that should have stopped it (an aborted or failed collective, then
    ignored): what it trains is nobody's model. Membership mode, whose replica groups rightly go
    on without each other, is left out; so are the steps a producer may run ahead through its
    bounded queue (the ``queue`` depth it recorded): a pipeline's targets share no collective,
    and a fast one fills its queue before a dead peer stalls the consumer (seen on a GPU)."""
    if history.member_events():
        return []
    problems: list[dict[str, Any]] = []
    for g in history.generations:
        steps = sorted(history.ended(g))
        ended: dict[int, set[int]] = {}
        for s in steps:
            for r in history.ended_by(g, s):
                ended.setdefault(r, set()).add(s)
        roles: dict[str, set[int]] = {}
        for r in history.starts(g):
            roles.setdefault(history.role(g, r), set()).add(r)
        depths = _queue_depths(history, g, steps)
        moved = history.replaced(g)
        for role, ranks in roles.items():
            if len(ranks) < 2:
                continue
            together = [s for s in steps if ranks <= history.ended_by(g, s)]
            base = together[-1] if together else min(steps, default=0) - 1
            for r in sorted(ranks):
                ahead = max(1, depths.get(r, 0))
                alone = sorted(s for s in ended.get(r, ()) if s > base + ahead)
                if not alone:
                    continue
                others = ", ".join(str(x) for x in sorted(ranks - {r}))
                last = f"up to step {base}" if together else "no step"
                why = (f"its shard had moved to a new process (rank {r} of generation {g + 1}), "
                       "and the old owner went on beside it" if moved == r else
                       "it trained on without its peers, past an error it swallowed (a failed "
                       "or aborted collective)")
                problems.append({
                    "message": f"rank {r} (role {role}) of generation {g} ended steps "
                               f"{_ranges(alone)} that rank{'s' if len(ranks) > 2 else ''} "
                               f"{others} never ended (all of them ended {last}): {why}",
                    "step": alone[0], "rank": r, "generation": g, "fault": None})
    return problems


def _queue_depths(history: History, gen: int, steps: list[int]) -> dict[int, int]:
    """rank -> the deepest queue it recorded in ``gen`` (ranks that record none are absent)."""
    out: dict[int, int] = {}
    for s in steps:
        for rank, depth in history.metric(gen, s, "queue").items():
            out[rank] = max(out.get(rank, 0), int(depth))
    return out


def _trained_after_sigterm(history: History) -> list[dict[str, Any]]:
    """Ranks that began steps after the one in flight when a preemption's SIGTERM reached them.

    The SIGTERM reaches a rank at the fault point when the rank raises it itself, later when a
    scheduler delivers it (SLURM's slurmstepd, tens of ms on; a ``deliver`` event): where the
    probe recorded its arrival (``signal``), that is where the count starts, and a scheduler's
    SIGTERM that never arrived (the rank had finished) starts none. A signal that arrived
    between two steps allows the next one: the rank may have asked ``stop_requested()`` just
    before it."""
    preempts = _preempt_kinds()
    delivered = _delivered(history)
    problems: list[dict[str, Any]] = []
    for f in history.faults_fired():
        if f.kind not in preempts:
            continue
        if (f.gen, f.id) in delivered and _landed(history, f) is None:
            continue  # the scheduler's SIGTERM never reached it: see _sigterm_unseen
        seen, landed, arrived, limit, after = False, False, f.step, f.step, set()
        begun = ended = None
        for e in history.timeline(gen=f.gen, rank=f.rank):
            if seen and isinstance(e, Started):
                break  # a new process of this rank (membership mode restarted its group)
            if isinstance(e, FaultFired) and (e.kind, e.step, e.phase) == (f.kind, f.step, f.phase):
                seen = True
            elif seen and not landed and _is_sigterm(e) and begun is not None:
                landed, arrived = True, begun  # in the step begun last, or just after it ended
                limit = begun + 1 if ended == begun else begun
            if isinstance(e, Begun):
                begun = e.step
                if seen:
                    after.add(begun)
            elif isinstance(e, Ended):
                ended = e.step
        later = {step for step in after if step > limit}
        if later:
            n = len(later)
            same = next((p for p in problems if p["generation"] == f.gen
                         and p["steps"] == later), None)
            if same is not None:   # the same steps on another rank: said once
                same["also"].append(f.rank)
                continue
            problems.append({"steps": later, "also": [],
                "message": f"rank {f.rank} kept training {n} step{'s' if n != 1 else ''} after "
                           f"SIGTERM (steps {_ranges(later)}); a spot node would have been "
                           f"reclaimed: after the SIGTERM at step {arrived} "
                           + (f"({f.phase}, " if arrived == f.step else "(delivered after the "
                              f"fault at step {f.step}, ") +
                           f"generation {f.gen}) ask run.stop_requested() after every step, and "
                           "save and exit when it is true",
                "step": min(later), "rank": f.rank, "generation": f.gen,
                "fault": history.describe_fault(f.id)})
    for p in problems:
        if p["also"]:
            others = ", ".join(map(str, p["also"]))
            p["message"] += f" (so did rank{'s' if len(p['also']) > 1 else ''} {others})"
    return problems


def _is_sigterm(e: Any) -> bool:
    """A SIGTERM the probe saw land (not the record that its flag was installed)."""
    return isinstance(e, Signal) and e.signal == PREEMPT_SIGNAL.name and not e.armed


def _delivered(history: History) -> set[tuple[int, Any]]:
    """(generation, fault id) of the preemptions a scheduler delivered (``deliver`` events)."""
    return {(d.gen, d.fault_id) for d in history.deliveries()}


def _landed(history: History, f: Any) -> Signal | None:
    """The first SIGTERM that landed on the fault's rank after the fault fired."""
    return next((s for s in history.signals(gen=f.gen, rank=f.rank)
                 if _is_sigterm(s) and s.t >= (f.t or 0.0)), None)


def _never_exercised(history: History) -> list[str]:
    """Faults that fired but whose effect no later generation met: a byte flipped in the run's
    last generation is in a checkpoint nothing resumed from, so whether a resume would notice the
    corruption was never tested (and a pass would claim it was)."""
    last = max(history.generations, default=None)
    return [f"the byte flipped in `{e.path}` (generation {e.gen}, step {e.at_step}) was never read "
            "back: the run ended without a resume after it, so whether a resume notices the "
            "corruption was not tested; aim the flip at an earlier save, or run more steps after it"
            for e in history.file_events(gen=last) if e.op == FileOp.FLIP]


def _sigterm_unseen(history: History) -> list[str]:
    """Ranks a scheduler was asked to SIGTERM that recorded no SIGTERM, where that cannot tell
    "finished before it landed" from "ignored it": their SIGTERM flag was not the probe's (never
    installed, or replaced by another handler) or they never said so at exit."""
    out = []
    delivered = _delivered(history)
    for f in history.faults_fired():
        if (f.gen, f.id) not in delivered or _landed(history, f) is not None:
            continue
        armed = any(s.armed for s in history.signals(gen=f.gen, rank=f.rank))
        exits = history.exits(gen=f.gen, rank=f.rank)
        if armed and exits and not exits[-1].sigterm_replaced:
            continue  # the probe's flag was on until it exited: no SIGTERM landed before that
        why = ("its SIGTERM flag was replaced by another handler" if exits and
               exits[-1].sigterm_replaced else "it never called run.stop_requested()"
               if not armed else "it exited without run.close()")
        out.append(f"rank {f.rank} recorded no SIGTERM after the scheduler was asked to preempt "
                   f"generation {f.gen} ({why}), so whether it trained on after one landed is "
                   "unknown; call run.stop_requested() before training and run.close() at the end")
    return out


def _unfired_reason(history: History, fault: Any, u: Any) -> str:
    """Why a scheduled fault never fired, from what the history shows."""
    phase = fault.get("phase") if fault else None
    step = fault.get("step") if fault else None
    marked = history.marked_phases()
    if phase not in (None, "begin", "end") and phase not in marked:
        return (f"no rank ever marked the point {phase!r}; does the workload call "
                f"s.point({phase!r})?")
    target = str(fault.get("target") or "") if fault else ""
    ranks = {int(target.split(":")[1])} if target.startswith("rank:") else None
    gone = [d for d in history.detections()
            if (ranks is None or d.rank in ranks) and (step is None or d.step is None
                                                       or d.step <= step)]
    if gone:
        d = gone[0]
        return (f"its target was gone before it got there: {_what(d)} (generation {d.gen}"
                f"{', by a scheduled fault' if d.expected else ''})")
    begun = [s for g in history.generations for s in history.begun(g)]
    if step is None or not begun or step not in begun:
        last = max(begun, default=None)
        return ("the run never reached that step" +
                (f" (the last step begun was {last})" if last is not None else ""))
    return f"its target never reached step {step} ({phase}) in a generation where it was planned"


def liveness(history: History, *, run_dir: str | Path | None = None) -> Verdict:
    """The run reached its last step, and nothing died, hung or went silent unexplained.

    ``run_dir``: the run's folder; when given, a failing rank's message ends with the last lines
    of its log (``logs/g{gen}-r{rank}.log``).

    What the harness's hub kept out is said too: refused connections never reached the history
    (the verdict stands, and names them); a dropped line of a trusted rank is missing from it, so
    a pass becomes unknown."""
    v = _liveness(history, run_dir=run_dir)
    refused, dropped = history.hub_kept_out()
    if not refused and not dropped:
        return v
    said = "; ".join(dropped + refused)
    details = {**v.details, "hub_refused": refused, "hub_dropped": dropped}
    if dropped and v.status == PASS:
        return Verdict.unknown(v.check, f"the harness's hub dropped what a rank sent, so the "
                               f"history may lack events: {said}; see the hub's bounds "
                               "(supervisor/hub.py) and that rank's log", details=details)
    return dataclasses.replace(v, message=f"{v.message}; the harness's hub: {said}",
                               details=details)


def _liveness(history: History, *, run_dir: str | Path | None = None) -> Verdict:
    check = "liveness"
    folder = Path(run_dir) if run_dir is not None else None
    stacks = folder or (Path(history.run_dir) if history.run_dir is not None else None)
    final = history.final_generation
    if final is None:
        return Verdict.unknown(check, "the history has no generation: no rank recorded anything")
    if history.never_started() is not None:
        p = _never_started_problem(history, folder)
        problems = [p]
        for u in history.unfired():
            desc = history.describe_fault(u.fault_id) or "a scheduled fault"
            problems.append({"message": f"fault {desc} never fired: the run never began a step",
                             "step": None, "rank": None, "generation": None, "fault": desc})
        details = {"problems": [x["message"] for x in problems], "never_started": True,
                   "detections": len(history.detections())}
        text = p["message"] + (f" ({len(problems) - 1} scheduled fault"
                               f"{'s' if len(problems) > 2 else ''} never fired)"
                               if len(problems) > 1 else "")
        return Verdict.failed(check, text, step=None, rank=p["rank"], generation=p["generation"],
                              details=details)
    problems = []
    logged = False
    guarded: dict[int, float] = {}   # generation -> when a rank's own check caught corruption
    for note in history.notes(GUARD):
        guarded.setdefault(note.gen, note.t)
    for d in history.detections():
        if not d.expected and not (d.kind == Detected.DIED and d.gen in guarded
                                   and (d.t is None or d.t >= guarded[d.gen])):
            # The first rank that raised (a positive exit code) shows the end of its log once.
            show = not logged and d.kind == Detected.DIED and (d.exit_code or 0) > 0
            logged = logged or show
            problems.append({"message": _describe_detection(d, history, folder, log=show,
                                                            stacks=stacks),
                             "step": d.step,
                             "rank": d.rank, "generation": d.gen, "fault": None})
    problems.extend(_trained_after_sigterm(history))
    problems.extend(_trained_alone(history))
    described = {(p["generation"], p["rank"]) for p in problems}
    for n in history.notes(NOT_INJECTED):
        if (n.gen, n.rank) not in described:  # a death is said with its detection above
            desc = history.describe_fault(n.fields.get("fault_id")) or "a scheduled fault"
            problems.append({"message": f"fault {desc} fired on rank {n.rank} (generation "
                             f"{n.gen}) but could not be injected: {n.fields.get('reason')}; "
                             "the run never faced it", "step": n.step, "rank": n.rank,
                             "generation": n.gen, "fault": desc})
    fired_ranks: set[tuple[int, int | None]] = {(f.gen, f.rank) for f in history.faults_fired()}
    fired_ranks |= {(d.gen, d.rank) for d in history.detections() if d.expected}
    detected = {(d.gen, d.rank) for d in history.detections()}
    for g, gen in history.generations.items():
        starts = history.starts(g)
        anyone_ended = bool(history.ended(g))
        for r in range(gen.world_size):
            if r not in starts and (g, r) not in detected and (
                    anyone_ended or gen.cause in (None, Cause.COMPLETE, Cause.RESHARD, Cause.PREEMPT)):
                problems.append({"message": f"rank {r} of generation {g} never recorded a start: it "
                                 "never called probe.attach() (it died before, or was never "
                                 "launched)", "step": None, "rank": r, "generation": g,
                                 "fault": None})
    ended_by: dict[int, int] = {}
    for s in history.ended(final.gen):
        for r in history.ended_by(final.gen, s):
            ended_by[r] = max(ended_by.get(r, -1), s)
    if ended_by:
        began = {s.rank for s in history.step_spans(gen=final.gen)}
        for r in range(final.world_size):
            if r in ended_by or (final.gen, r) in fired_ranks or r not in history.starts(final.gen):
                continue
            others = ", ".join(str(x) for x in sorted(ended_by))
            errors = history.errors(gen=final.gen, rank=r)
            last = (f"; its last error: {errors[-1].error} at step {errors[-1].step}"
                    if errors else "")
            role = history.role(final.gen, r)
            state = ("it died silently or sits idle" if r in began else
                     "it attached but never began a step: it died silently or sits idle")
            problems.append({"message": f"rank {r} (role {role or '?'}) of generation {final.gen} "
                             f"finished no step while ranks {others} finished up to step "
                             f"{max(ended_by.values())}: {state}{last}",
                             "step": None, "rank": r, "generation": final.gen, "fault": None})
    for u in history.unfired():
        fid = u.fault_id
        fault = history.scenario.fault(fid) if history.scenario else None
        desc = history.describe_fault(fid) or "a scheduled fault"
        why = _unfired_reason(history, fault, u)
        detail = str(u.detail or "")
        extra = f" ({detail})" if detail and detail not in desc else ""
        problems.append({"message": f"fault {desc} never fired: {why}{extra}",
                         "step": fault.get("step") if fault else None, "rank": None,
                         "generation": None, "fault": desc})
    for a in history.aborts():
        detail = a.detail if a.detail is not None else "aborted the run"
        problems.append({"message": f"the supervisor {detail}",
                         "step": None, "rank": None, "generation": None, "fault": None})
    for g, gen in history.generations.items():
        if gen.cause == Cause.TIMEOUT:
            problems.append({"message": f"the run hit its timeout in generation {g}"
                             f"{': ' + gen.detail if gen.detail else ''}; raise timeout= if the "
                             "workload is only slow, else look for a hang", "step": None,
                             "rank": None, "generation": g, "fault": None})
    target = history.target_step()
    committed = history.committed(final.gen)
    if target is not None and not history.reached_target():
        reached = (f"last committed step {max(committed)}" if committed else "no step committed")
        said = final.detail and any(final.detail in p["message"] for p in problems)
        how = (f"; generation {final.gen} ended by {final.cause}"
               f"{': ' + final.detail if final.detail and not said else ''}"
               if final.cause and final.cause != Cause.TIMEOUT else "")
        problems.append({"message": f"the run did not reach its target: step {target} never "
                         f"committed in the final generation {final.gen} ({reached}){how}",
                         "step": target, "rank": None, "generation": final.gen,
                         "fault": history.describe_fault(final.fault_id)})
    details = {"problems": [p["message"] for p in problems], "target": target,
               "detections": len(history.detections())}
    if problems:
        first = problems[0]
        return Verdict.failed(check, _summarise([p["message"] for p in problems]),
                              step=first["step"], rank=first["rank"],
                              generation=first["generation"], fault=first["fault"],
                              details=details)
    if target is None:
        return Verdict.unknown(check, "no scenario record, so the target step is unknown; nothing "
                               "else went wrong", details=details)
    unseen = _sigterm_unseen(history) + _never_exercised(history)
    if unseen:
        return Verdict.unknown(check, _summarise(unseen), details=details)
    found = history.detections()
    briefly = "; ".join(f"{_short(d)}, noticed after {d.latency_s:.2f} s"
                        if d.latency_s is not None else _short(d) for d in found[:3])
    more = f"; {len(found) - 3} more" if len(found) > 3 else ""
    return Verdict.passed(check, f"reached step {target} in generation {final.gen}; "
                          f"{len(found)} detection{'' if len(found) == 1 else 's'}"
                          f"{f' ({briefly}{more})' if found else ''}, all explained by scheduled "
                          "faults; every scheduled fault fired", details=details)


#: Each clean run's liveness, asked for by every check compared with it (a thousand ranks' run
#: takes seconds to judge), for as long as the run is held.
_CLEAN: "weakref.WeakKeyDictionary[History, Verdict]" = weakref.WeakKeyDictionary()


def _clean_liveness(h: History) -> Verdict:
    v = _CLEAN.get(h)
    if v is None:
        v = _CLEAN[h] = liveness(h)
    return v


def clean_problem(h: History) -> str | None:
    """Why a clean (fault-free) run cannot be compared with: the first problem liveness finds
    in it (None: it passed)."""
    v = _clean_liveness(h)
    if v.status == PASS:
        return None
    problems = v.details.get("problems") or [v.message]
    return str(problems[0])


def clean_failure(h: History) -> str | None:
    """What went wrong in a clean (fault-free) run, in a few words (None: it passed liveness)."""
    v = _clean_liveness(h)
    if v.status != FAIL:
        return None
    unexpected = sorted((d for d in h.detections() if not d.expected), key=lambda d: d.t or 0.0)
    if unexpected:
        return _short(unexpected[0])
    problems = v.details.get("problems") or [v.message]
    return str(problems[0])


@register("liveness", column="live", assertion="assert_live",
          description="the run finished; no rank died, stopped or vanished without a scheduled "
                      "fault; every scheduled fault fired")
def _check(ctx: CheckContext) -> Verdict:
    """The run's own liveness; first, when the clean reference run fails too, that the workload
    fails without any fault (no reference is run for a run that never began a step)."""
    v = liveness(ctx.history, run_dir=ctx.history.run_dir)
    if ctx.history.never_started() is not None or not ctx.has_references:
        return v
    try:
        reference, _ = ctx.clean_first()
    except Exception:  # noqa: BLE001 - a clean run that cannot start: its checkers say so
        return v
    for h in (reference,):
        what = clean_failure(h) if h is not None else None
        if h is None or what is None:
            continue
        gens = h.generations
        size = h.scenario.world_size if h.scenario else (gens[min(gens)].world_size if gens else "?")
        text = (f"the workload fails without any fault (reference run at {size} ranks: {what}); "
                "fix that before chaos testing")
        if v.status != PASS:
            text += f"; this run: {v.message}"
        details = dict(v.details)
        details["clean_run_fails"] = what
        return Verdict.failed("liveness", text, step=v.step, rank=v.rank, generation=v.generation,
                              fault=v.fault, details=details)
    return v
