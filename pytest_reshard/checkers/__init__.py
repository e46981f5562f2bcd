"""Checkers: pure functions ``History -> Verdict`` that decide whether training survived (a contract).

Each checker reads only the history (plus keyword-only inputs such as a reference run), so it is
tested on hand-built histories without starting a process. A checker that cannot decide says
``unknown`` and what the workload must record to let it decide; it never guesses a pass.

The definitions (DESIGN.md, "Definitions the checkers use") and the choices made here:

- **no_rewind**: a rewind is a committed step executed again. At each generation change the cost
  is the number of committed steps still in effect that the new generation's resume step throws
  away (a step discarded once is not charged again). Planned transitions (a reshard with notice, a
  SIGTERM preemption) may cost 0; unplanned ones at most ``max_rewind_steps`` (undeclared: 0).
  Resuming *past* steps that never ran is flagged too.
- **loss_continuity**: the noise floor of a step is ``max(spread, 1e-7 * |reference loss|)``:
  the spread between clean runs at different world sizes (measured, an input), never below one
  float32 rounding of the loss. The tolerance is ``10`` noise floors, because the spread is the
  largest difference seen in a couple of clean runs, and a resharded run that crosses several
  world sizes may legitimately land a few times beyond it; real state bugs measured here are
  10^4-10^6 floors away. Without a measured spread, anything beyond float rounding is ``unknown``.
- **exactly_once_samples**: counts ``(epoch, sample)`` per role over the kept occurrences (see
  ``History.kept``), so a target and its drafter may both see a sample, but no two ranks of one
  role and no two steps may.
- **state_equivalence**: compares load digests with the latest earlier save of the same step, or
  with the load's own ``expected`` digest, component by component.
- **liveness**: the final generation committed the last step; every death, stop or stall is
  explained by a scheduled fault; every scheduled fault fired; every rank started.
- **sample_ledger** (pipelines): in every kept step the consumer role took exactly the samples
  the producer role made for that step, so a dropped share or a batch delivered twice is named.
- **throughput**: tokens/s per generation and role against a clean run of the same topology
  (failing only below a declared fraction: short rates on a shared CPU swing too much to guess
  one), judged per CPU other processes left; and every rank of a role doing its share, so a
  pool that silently shrank fails without any reference.
"""
from __future__ import annotations

import inspect
import math
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from pytest_reshard.history import Detection, Generation, History, Occurrence
from pytest_reshard.verdict import Verdict

__all__ = [
    "no_rewind", "loss_continuity", "measure_spread", "exactly_once_samples", "state_equivalence",
    "liveness", "sample_ledger", "throughput", "DEFAULT_CHECKS", "run_checks", "SPREAD_FACTOR",
    "ROUNDING_FLOOR",
]

#: A deviation beyond this many noise floors fails loss_continuity.
SPREAD_FACTOR = 10.0
#: The smallest noise floor, relative to |loss|: about one float32 rounding (eps = 1.19e-7).
ROUNDING_FLOOR = 1e-7
_MAX_LISTED = 3


# -- shared helpers ------------------------------------------------------------------------------
def _ranges(steps: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0..2, 5, 7..8"``."""
    out: list[str] = []
    items = sorted(set(steps))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}..{items[j]}")
        i = j + 1
    return ", ".join(out)


def _previous(history: History, gen: int) -> Generation | None:
    earlier = [g for g in history.generations if g < gen]
    return history.generations[max(earlier)] if earlier else None


def _fault_before(history: History, gen: int) -> str | None:
    """The scheduled fault that ended the generation before ``gen``, described."""
    prev = _previous(history, gen)
    return history.describe_fault(prev.fault_id) if prev else None


def _cause_phrase(history: History, ended: Generation) -> str:
    """How a generation ended, in words: 'a planned reshard (shift_shards(all) at step 12 ...)'."""
    fault = history.describe_fault(ended.fault_id)
    words = {
        "reshard": "a planned reshard" if ended.planned else "an unplanned reshard",
        "preempt": "a preemption (SIGTERM)", "failure": "an unplanned failure",
        "hang": "a hang", "timeout": "a timeout", "error": "a harness error",
        "complete": "a completed generation", "drain": "a drain the workload requested",
        "rebalance": "a planned rebalance",
    }
    if ended.cause is None:
        return f"generation {ended.gen} ended with no supervisor record (treated as unplanned)"
    text = words.get(ended.cause, f"{'a planned' if ended.planned else 'an unplanned'} "
                                  f"{ended.cause}")
    return f"{text} ({fault})" if fault else text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _summarise(messages: list[str]) -> str:
    """The first message, plus a count and the next few."""
    if len(messages) == 1:
        return messages[0]
    more = messages[1:1 + _MAX_LISTED]
    tail = "; ".join(more) + ("; ..." if len(messages) > 1 + _MAX_LISTED else "")
    return f"{messages[0]} (+{len(messages) - 1} more: {tail})"


# -- no_rewind -----------------------------------------------------------------------------------
def no_rewind(history: History) -> Verdict:
    """No committed step is executed again beyond the budget, and no step is skipped."""
    check, replay = "no_rewind", history.replay
    if not history.generations:
        return Verdict.unknown(check, "the history has no generation: no rank recorded anything; "
                               "does the workload call probe.attach()?", replay=replay)
    live_committed: set[int] = set()   # committed steps whose effect is still in the state
    live_ended: set[int] = set()       # steps some rank finished, still in the state
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
                if planned:
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
            before = (f"the last step finished before was {last}" if last >= 0
                      else "no step had finished before")
            problems.append({
                "message": f"generation {g} resumed at step {resume} but {before}: steps "
                           f"{_ranges(range(last + 1, resume))} were never run; the resume step "
                           "must be the saved step + 1",
                "step": resume, "generation": g, "fault": _fault_before(history, g)})
        live_committed = {s for s in live_committed if s < resume and s not in began}
        live_committed |= history.committed(g)
        live_ended = {s for s in live_ended if s < resume} | history.ended(g)
        pending = [gen]
    details = {"transitions": transitions, "problems": [p["message"] for p in problems]}
    if problems:
        first = problems[0]
        return Verdict.failed(check, _summarise([p["message"] for p in problems]),
                              step=first["step"], generation=first["generation"],
                              fault=first["fault"], details=details, replay=replay)
    if not transitions:
        return Verdict.passed(check, "no generation resumed after another: nothing replayed",
                              details=details, replay=replay)
    lost = [t for t in transitions if t["replayed"]]
    if lost:
        text = ", ".join(f"generation {t['generation']} replayed {len(t['replayed'])} of "
                         f"budget {t['budget']}" for t in lost)
        return Verdict.passed(check, f"{_count(len(transitions), 'generation transition')}, "
                                     f"rewinds within budget: {text}", details=details,
                              replay=replay)
    return Verdict.passed(check, f"{_count(len(transitions), 'generation transition')} replayed no "
                                 "committed step", details=details, replay=replay)


# -- loss_continuity -----------------------------------------------------------------------------
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


# -- exactly_once_samples ------------------------------------------------------------------------
def _at(occ: Occurrence, rank: int) -> str:
    return f"step {occ.step} (generation {occ.gen}, rank {rank})"


def exactly_once_samples(history: History, *, reference: History | None = None) -> Verdict:
    """Every (epoch, sample) of the kept steps is consumed once; with a reference, none is lost."""
    check, replay = "exactly_once_samples", history.replay
    if not history.has_samples():
        return Verdict.unknown(check, "the workload recorded no sample ids; call "
                               "s.record(samples=batch_ids) as soon as the batch is drawn",
                               replay=replay)
    kept = history.kept()
    seen: dict[tuple[str, int, int], tuple[Occurrence, int]] = {}
    dups: list[tuple[tuple[str, int, int], tuple[Occurrence, int], tuple[Occurrence, int]]] = []
    for occ in kept:
        for rank, pairs in sorted(history.samples(occ.gen, occ.step).items()):
            role = history.role(occ.gen, rank)
            for epoch, sample in pairs:
                key = (role, epoch, sample)
                if key in seen:
                    dups.append((key, seen[key], (occ, rank)))
                else:
                    seen[key] = (occ, rank)
    consumed = {(epoch, sample) for _, epoch, sample in seen}

    details: dict[str, Any] = {"kept_steps": len(kept), "samples": len(consumed),
                               "duplicates": len(dups)}
    if dups:
        (role, epoch, sample), (o1, r1), (o2, r2) = dups[0]
        if o1 == o2:
            why = "two ranks of one step drew it: the sampler's rank or world size is wrong"
        elif o1.gen != o2.gen:
            why = ("the data position was not restored across the generation change, or the new "
                   "world size re-split samples already consumed")
        else:
            why = "the data loader repeated it within one generation"
        again = "again at" if o1 != o2 else "at"
        text = (f"sample {sample} (epoch {epoch}) consumed twice: at {_at(o1, r1)} and {again} "
                f"{_at(o2, r2)}; {why}")
        if len(dups) > 1:
            text += f" ({len(dups)} duplicates in all)"
        details["first_duplicates"] = [
            {"sample": k[2], "epoch": k[1], "role": k[0], "first": [a.step, a.gen, ra],
             "again": [b.step, b.gen, rb]} for k, (a, ra), (b, rb) in dups[:20]]
        return Verdict.failed(check, text, step=o2.step, rank=r2, generation=o2.gen,
                              fault=_fault_before(history, o2.gen) if o2.gen != o1.gen else None,
                              details=details, replay=replay)
    if reference is None:
        return Verdict.passed(check, f"{len(consumed)} samples consumed exactly once over "
                              f"{len(kept)} kept steps (no reference: lost samples not checked)",
                              details=details, replay=replay)
    last = max((o.step for o in kept), default=-1)
    # Per role: in a pipeline a sample its targets made but no drafter trained on is lost.
    expected: dict[tuple[str, int, int], int] = {}
    for occ in sorted(reference.kept()):
        if occ.step <= last:
            for rank, pairs in sorted(reference.samples(occ.gen, occ.step).items()):
                for epoch, sample in pairs:
                    expected.setdefault((reference.role(occ.gen, rank), epoch, sample), occ.step)
    lost = sorted(set(expected) - set(seen), key=lambda k: (expected[k], k))
    details["lost"] = len(lost)
    details["not_in_reference"] = len(set(seen) - set(expected))  # a data-order change, not a loss
    if lost:
        drawn: dict[tuple[int, int], Occurrence] = {}
        kept_set = set(kept)
        for e in history.rank_events("record"):
            occ = Occurrence(int(e["step"]), int(e["gen"]))
            if occ not in kept_set:
                for s in e.get("samples") or ():
                    drawn.setdefault((int(e.get("epoch", 0) or 0), int(s)), occ)
        role, epoch, sample = lost[0]
        where = drawn.get((epoch, sample))
        fate = (f"; it was drawn at step {where.step} in generation {where.gen}, whose effect was "
                "discarded" if where else "; no kept or discarded step drew it")
        by = f" by a {role} rank" if len({k[0] for k in expected}) > 1 else ""
        text = (f"{len(lost)} samples the reference consumed by step {last} were never consumed"
                f"{by}: first sample {sample} (epoch {epoch}), reference step "
                f"{expected[lost[0]]}{fate}; restore the data position saved with the checkpoint"
                + (", and give a lost rank's share to the survivors" if by else ""))
        details["lost_samples"] = [[r_, e_, s_] for r_, e_, s_ in lost[:50]]
        gen = where.gen if where else None
        return Verdict.failed(check, text, step=expected[lost[0]], generation=gen,
                              details=details, replay=replay)
    return Verdict.passed(check, f"{len(consumed)} samples consumed exactly once over {len(kept)} "
                          f"kept steps, none of the reference's lost", details=details,
                          replay=replay)


# -- state_equivalence ---------------------------------------------------------------------------
def state_equivalence(history: History) -> Verdict:
    """The state just after each load equals what was saved (or read), component by component."""
    check, replay = "state_equivalence", history.replay
    gens = history.generations
    first_gen = min(gens, default=0)
    loads = [c for c in history.checkpoints("load") if c.digest]
    saves = [c for c in history.checkpoints("save") if c.digest]
    advice = ("call run.checkpoint_saved(step, digest) and run.checkpoint_loaded(step, digest) with "
              "probe.digest() of each component (model, optimizer, lr_schedule, data, rng)")
    resumed = [g for g in gens.values() if g.gen != first_gen and (g.resume_step or 0) > 0]
    loaded_gens = {c.gen for c in loads}
    unverified = [f"generation {g.gen} resumed at step {g.resume_step} without recording a load "
                  "digest" for g in resumed if g.gen not in loaded_gens]
    mismatches: list[dict[str, Any]] = []
    verified = 0
    for load in loads:
        earlier = [s for s in saves if s.step == load.step and s.gen < load.gen]
        if earlier:
            src_gen = max(s.gen for s in earlier)
            baseline: dict[str, str] = {}
            for s in sorted((s for s in earlier if s.gen == src_gen),
                            key=lambda s: (s.rank, -s.index)):
                for comp, d in s.digest.items():
                    baseline.setdefault(comp, d)
            source = f"saved in generation {src_gen}"
        elif load.expected:
            src_gen, baseline, source = None, dict(load.expected), "read (the load's expected digest)"
        else:
            if load.gen != first_gen:
                unverified.append(f"the load of step {load.step} in generation {load.gen} (rank "
                                  f"{load.rank}) has no earlier save of step {load.step} and no "
                                  "expected digest")
            continue
        common = sorted(set(baseline) & set(load.digest))
        if not common:
            unverified.append(f"the load of step {load.step} in generation {load.gen} shares no "
                              f"component with what was {source} (saved {sorted(baseline)}, "
                              f"loaded {sorted(load.digest)})")
            continue
        verified += 1
        differ = [c for c in common if baseline[c] != load.digest[c]]
        if differ:
            mismatches.append({"load": load, "differ": differ, "baseline": baseline,
                               "src_gen": src_gen, "source": source})
    details: dict[str, Any] = {"loads_verified": verified, "unverified": unverified,
                               "mismatches": len(mismatches)}
    if mismatches:
        m = mismatches[0]
        load = m["load"]
        src = gens.get(m["src_gen"]) if m["src_gen"] is not None else _previous(history, load.gen)
        dst = gens.get(load.gen)
        sizes = (f" (world size {src.world_size} -> {dst.world_size})" if src and dst else "")
        kind = "resharded load" if src and dst and src.world_size != dst.world_size else "load"
        comps = " and ".join(m["differ"])
        verb = "differs" if len(m["differ"]) == 1 else "differ"
        digests = ", ".join(f"{c}: {m['baseline'][c]} -> {load.digest[c]}" for c in m["differ"])
        if "model" in m["differ"]:
            hint = ("the parameters themselves did not round-trip: shards landed in the wrong "
                    "place or were changed after loading; compare the sharding (device mesh, "
                    "placements) at save and at load")
        elif "optimizer" in m["differ"]:
            hint = ("save and load it through torch.distributed.checkpoint.state_dict "
                    "(get_state_dict/set_state_dict): the raw optimizer.state_dict() drops "
                    "sharded state")
        else:
            hint = ("the checkpoint does not round-trip it across this world size: save it with "
                    "the checkpoint and restore it on load")
        text = (f"{comps} state {verb} after the {kind} of step {load.step} in generation "
                f"{load.gen}{sizes} on rank {load.rank}: what was {m['source']} does not match what "
                f"was loaded ({digests}); {hint}")
        if len(mismatches) > 1:
            text += f" ({len(mismatches)} mismatching loads in all)"
        details["differ"] = m["differ"]
        return Verdict.failed(check, text, step=load.step, rank=load.rank, generation=load.gen,
                              fault=_fault_before(history, load.gen), details=details,
                              replay=replay)
    if unverified:
        return Verdict.unknown(check, f"{_summarise(unverified)}; {advice}", details=details,
                               replay=replay)
    if verified:
        return Verdict.passed(check, f"{verified} loads match what was saved, component by "
                              "component", details=details, replay=replay)
    if len(gens) <= 1:
        return Verdict.passed(check, "single generation: no reshard to check", details=details,
                              replay=replay)
    return Verdict.passed(check, "no generation resumed from saved state (each started at step 0): "
                          "no state to compare", details=details, replay=replay)


# -- liveness ------------------------------------------------------------------------------------
def _describe_detection(d: Detection) -> str:
    at = (f"at step {d.step}, phase {d.phase}" if d.step is not None and d.phase
          else f"at step {d.step}" if d.step is not None else "before its first step")
    who = f"rank {d.rank}" if d.rank is not None else "a rank"
    code = ""
    if d.exit_code is not None:
        code = (f" (killed by signal {-d.exit_code})" if d.exit_code < 0
                else f" (exit code {d.exit_code})")
    what = {
        "died": f"{who} died{code} {at}",
        "stopped": f"{who} stopped responding {at}",
        "stalled": f"{who} stalled {at}: alive, but no progress",
        "exited_early": f"{who} exited early{code} {at}, before the run finished",
        "oom": d.detail or f"{who} exceeded its memory budget {at}",
    }.get(d.kind, f"{who} {d.kind} {at}")
    return (f"{what} (generation {d.gen}), and no scheduled fault explains it; read that rank's "
            "output in the run folder")


def liveness(history: History) -> Verdict:
    """The run reached its last step, and nothing died, hung or went silent unexplained."""
    check, replay = "liveness", history.replay
    final = history.final_generation
    if final is None:
        return Verdict.unknown(check, "the history has no generation: no rank recorded anything",
                               replay=replay)
    problems: list[dict[str, Any]] = []
    for d in history.detections():
        if not d.expected:
            problems.append({"message": _describe_detection(d), "step": d.step, "rank": d.rank,
                             "generation": d.gen, "fault": None})
    fired_ranks: set[tuple[int, int | None]] = {(f.gen, f.rank) for f in history.faults_fired()}
    fired_ranks |= {(d.gen, d.rank) for d in history.detections() if d.expected}
    for g, gen in history.generations.items():
        starts = history.starts(g)
        anyone_ended = bool(history.ended(g))
        for r in range(gen.world_size):
            if r not in starts and (anyone_ended or gen.cause in (None, "complete", "reshard",
                                                                  "preempt")):
                problems.append({"message": f"rank {r} of generation {g} never recorded a start: it "
                                 "died before probe.attach() or was never launched",
                                 "step": None, "rank": r, "generation": g, "fault": None})
    ended_by: dict[int, int] = {}
    for s in history.ended(final.gen):
        for r in history.ended_by(final.gen, s):
            ended_by[r] = max(ended_by.get(r, -1), s)
    if ended_by:
        for r in range(final.world_size):
            if r in ended_by or (final.gen, r) in fired_ranks or r not in history.starts(final.gen):
                continue
            others = ", ".join(str(x) for x in sorted(ended_by))
            errors = history.rank_events("error", gen=final.gen, rank=r)
            last = (f"; its last error: {errors[-1].get('error')} at step {errors[-1]['step']}"
                    if errors else "")
            role = history.role(final.gen, r)
            problems.append({"message": f"rank {r} (role {role or '?'}) of generation {final.gen} "
                             f"finished no step while ranks {others} finished up to step "
                             f"{max(ended_by.values())}: it died silently or sits idle{last}",
                             "step": None, "rank": r, "generation": final.gen, "fault": None})
    for u in history.unfired():
        fid = u.get("fault_id")
        fault = history.scenario.fault(fid) if history.scenario else None
        desc = history.describe_fault(fid) or "a scheduled fault"
        phase = fault.get("phase") if fault else None
        if phase in ("begin", "end") or phase is None:
            why = "the run never reached that step"
        else:
            why = (f"the workload never reached that point; does it call "
                   f"s.point({phase!r})?")
        detail = str(u.get("detail") or "")
        extra = f" ({detail})" if detail and detail not in desc else ""
        problems.append({"message": f"fault {desc} never fired: {why}{extra}",
                         "step": fault.get("step") if fault else None, "rank": None,
                         "generation": None, "fault": desc})
    for e in history.events:
        if e["ev"] == "abort":
            problems.append({"message": f"the supervisor {e.get('detail', 'aborted the run')}",
                             "step": None, "rank": None, "generation": None, "fault": None})
    for g, gen in history.generations.items():
        if gen.cause == "timeout":
            problems.append({"message": f"the run hit its timeout in generation {g}"
                             f"{': ' + gen.detail if gen.detail else ''}; raise timeout= if the "
                             "workload is only slow, else look for a hang", "step": None,
                             "rank": None, "generation": g, "fault": None})
    scenario = history.scenario
    target = scenario.steps - 1 if scenario else None
    committed = history.committed(final.gen)
    carried = (final.resume_step is not None and target is not None and final.resume_step > target
               and any(o.step == target for o in history.kept()))  # done before, resumed past it
    if target is not None and target >= 0 and target not in committed and not carried:
        reached = (f"last committed step {max(committed)}" if committed else "no step committed")
        how = (f"; generation {final.gen} ended by {final.cause}"
               f"{': ' + final.detail if final.detail else ''}" if final.cause else "")
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
                              details=details, replay=replay)
    if target is None:
        return Verdict.unknown(check, "no scenario record, so the target step is unknown; nothing "
                               "else went wrong", details=details, replay=replay)
    return Verdict.passed(check, f"reached step {target} in generation {final.gen}; "
                          f"{len(history.detections())} detections, all explained by scheduled "
                          "faults; every scheduled fault fired", details=details, replay=replay)


# -- registry ------------------------------------------------------------------------------------
Checker = Callable[..., Verdict]

#: The checkers ``assert_ok`` runs, by name.
# -- memory_headroom -----------------------------------------------------------------------------
MEMORY_MARGIN = 0.10


def memory_headroom(history: History, *, margin: float = MEMORY_MARGIN) -> Verdict:
    """Every rank's peak RSS stayed below ``(1 - margin)`` of the scenario's memory budget.

    The supervisor samples each rank's peak (VmHWM) and ends a rank that passes the budget; a
    rank that merely came close is the warning seed 001 never got (+200 MB after an upgrade).
    """
    check, replay = "memory_headroom", history.replay
    scenario = next((e for e in history.events if e["ev"] == "scenario"), {})
    budget = scenario.get("memory_budget_bytes")
    if not budget:
        return Verdict.unknown(check, "no memory budget set: pass memory_budget_bytes= to "
                               "reshard_run to check headroom", replay=replay)
    mib = 2 ** 20
    for d in history.detections():
        if d.kind == "oom":
            return Verdict.failed(check, d.detail or f"rank {d.rank} exceeded its memory budget",
                                  step=d.step, rank=d.rank, generation=d.gen, replay=replay)
    peaks = [e for e in history.events if e["ev"] == "rss"]
    if not peaks:
        return Verdict.unknown(check, "no rank's memory was sampled", replay=replay)
    top = max(peaks, key=lambda e: e["peak_bytes"])
    share = top["peak_bytes"] / budget
    where = f"rank {top['rank']} (generation {top['gen']})"
    if share > 1 - margin:
        return Verdict.failed(check, f"{where} peaked at {top['peak_bytes'] / mib:.0f} MiB, "
                              f"{share:.0%} of its {budget / mib:.0f} MiB budget: less than "
                              f"{margin:.0%} headroom; an upgrade that adds memory would kill it",
                              rank=top["rank"], generation=top["gen"], replay=replay)
    return Verdict.passed(check, f"highest peak {top['peak_bytes'] / mib:.0f} MiB on {where}, "
                          f"{share:.0%} of the {budget / mib:.0f} MiB budget", replay=replay)


# -- poisoned_commit -----------------------------------------------------------------------------
#: Phases at which a step's update has not been applied yet (``s.point("optimizer"); opt.step()``).
PRE_UPDATE = ("begin", "data", "forward", "backward", "optimizer")


def poisoned_commit(history: History) -> Verdict:
    """No step commits in a generation where a fatal ECC error hit one of its ranks during that
    step, before its update: an uncorrectable error makes that step's gradients untrustworthy,
    and nothing in the loss, samples or state shows it afterwards."""
    from pytest_reshard.telemetry import FATAL_XIDS

    check, replay = "poisoned_commit", history.replay

    def fatal(p: Mapping[str, Any]) -> bool:
        return p.get("layer") == "compute" or p.get("kind", "dbe") == "dbe" or p.get("xid") in FATAL_XIDS

    hits = [f for f in history.faults_fired()
            if f.kind == "ecc_error" and f.phase in PRE_UPDATE and fatal(f.params)]
    if not hits:
        return Verdict.passed(check, "no fatal device error hit a step before its update",
                              replay=replay)
    bad = [f for f in hits if f.step in history.committed(f.gen)]
    details = {"hits": [[f.gen, f.rank, f.step, f.phase] for f in hits],
               "committed": [[f.gen, f.rank, f.step, f.phase] for f in bad]}
    if not bad:
        return Verdict.passed(check, f"{_count(len(hits), 'fatal device error')} hit a step before "
                              "its update; none of those steps was committed", details=details,
                              replay=replay)
    f = bad[0]
    how = ("the health monitor must poll the device before the update, agree across ranks and "
           "abandon the step" if f.params.get("layer") != "compute" else
           "the workload swallowed the CUDA error and went on with the step")
    text = (f"step {f.step} was committed in generation {f.gen} although rank {f.rank}'s device "
            f"reported a fatal ECC error at its {f.phase} point, before the update "
            f"({history.describe_fault(f.id)}); {how}")
    if len(bad) > 1:
        text += f" ({len(bad)} poisoned steps committed in all)"
    return Verdict.failed(check, text, step=f.step, rank=f.rank, generation=f.gen,
                          fault=history.describe_fault(f.id), details=details, replay=replay)


# -- pipelines: sample_ledger, throughput -------------------------------------------------------
#: The producer and consumer roles of a target + drafter pipeline (the bundled ``dflash``).
PIPELINE_ROLES = ("target", "drafter")


def has_roles(history: History, *roles: str) -> bool:
    """Some generation has a rank of each of ``roles``."""
    return any(set(roles) <= set(g.roles) for g in history.generations.values())


def _by_role(history: History, occ: Occurrence, role: str) -> dict[tuple[int, int], int]:
    """(epoch, sample) -> the rank of ``role`` that recorded it in this occurrence."""
    return {pair: rank for rank, pairs in history.samples(occ.gen, occ.step).items()
            if history.role(occ.gen, rank) == role for pair in pairs}


def sample_ledger(history: History, *, producer: str = "target",
                  consumer: str = "drafter") -> Verdict:
    """Across the queue between two roles, every kept step's consumer ranks took exactly the
    samples its producer ranks made for that step: none dropped, none delivered from another
    step (a resend after a restart), none routed twice."""
    check, replay = "sample_ledger", history.replay
    if not has_roles(history, producer, consumer):
        return Verdict.unknown(check, f"no generation has both {producer!r} and {consumer!r} "
                               "ranks; the ledger checks a pipeline between those roles",
                               replay=replay)
    made_at: dict[tuple[int, int], list[Occurrence]] = {}
    for occ in history.kept():
        for pair in _by_role(history, occ, producer):
            made_at.setdefault(pair, []).append(occ)
    problems: list[tuple[Occurrence, str, int | None]] = []
    delivered = 0
    for occ in history.kept():
        made, took = _by_role(history, occ, producer), _by_role(history, occ, consumer)
        delivered += len(took)
        routed = Counter(pair for rank, pairs in history.samples(occ.gen, occ.step).items()
                         if history.role(occ.gen, rank) == consumer for pair in pairs)
        twice = sorted(p for p, n in routed.items() if n > 1)
        if twice:
            problems.append((occ, f"step {occ.step} (generation {occ.gen}): sample {twice[0][1]} "
                             f"(epoch {twice[0][0]}) reached two {consumer} ranks: a batch was "
                             f"routed twice", None))
        if not made and not took:
            continue
        dropped = sorted(set(made) - set(took))
        foreign = sorted(set(took) - set(made))
        where = f"step {occ.step} (generation {occ.gen})"
        if foreign:  # the more specific finding: the stream is out of step
            (epoch, sample) = foreign[0]
            origin = [o for o in made_at.get(foreign[0], []) if o != occ]
            source = (f"made at step {origin[0].step} (generation {origin[0].gen})" if origin
                      else "that no kept step made")
            also = f", and {len(dropped)} made for it never arrived" if dropped else ""
            problems.append((occ, f"{where}: {consumer} rank {took[foreign[0]]} took "
                             f"{_count(len(foreign), 'sample')} its {producer}s did not make for "
                             f"this step (e.g. sample {sample}, epoch {epoch}, {source}){also}: a "
                             f"batch was delivered twice or to the wrong step", took[foreign[0]]))
        elif dropped:
            (epoch, sample) = dropped[0]
            problems.append((occ, f"{where}: {_count(len(dropped), 'sample')} made by {producer} "
                             f"ranks never reached a {consumer} (e.g. sample {sample}, epoch "
                             f"{epoch}, from {producer} rank {made[dropped[0]]}): a share was "
                             f"dropped instead of redistributed", made[dropped[0]]))
    details = {"kept_steps": len(history.kept()), "delivered": delivered,
               "problems": [p[1] for p in problems[:20]]}
    if problems:
        occ, text, rank = problems[0]
        if len(problems) > 1:
            text += f" ({len(problems)} mismatched steps in all)"
        return Verdict.failed(check, text, step=occ.step, rank=rank, generation=occ.gen,
                              fault=_fault_before(history, occ.gen), details=details, replay=replay)
    return Verdict.passed(check, f"{delivered} samples crossed from {producer} to {consumer} "
                          f"ranks exactly as made, over {len(history.kept())} kept steps",
                          details=details, replay=replay)


class RoleRate(NamedTuple):
    """What one role did in one generation, over its steady steps (all but the first)."""

    tokens: float
    seconds: float               # wall time, scaled to the share of the machine left to the run
    steps: int
    wait: float                  # share of the ranks' time spent waiting on the other role
    queue: float | None          # mean queue depth the role recorded (producers), if any

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def role_rate(history: History, gen: int, role: str) -> RoleRate | None:
    """Tokens/s of ``role`` in ``gen``: tokens of the committed steps after the first one, over
    the time from the first one's end to the last's on the role's ranks (a producer that ran
    ahead into steps nobody consumed does not count them). None below 3 committed steps."""
    g = history.generations.get(gen)
    if g is None:
        return None
    ranks = {r for r, name in enumerate(g.roles) if name == role}
    steps = sorted(history.committed(gen))
    if len(steps) < 3 or not ranks:
        return None
    ends = {s: max(t for r, t in history.end_times(gen, s).items() if r in ranks) for s in steps}
    tokens = waited = 0.0
    depths = [d for s in steps for r, d in history.metric(gen, s, "queue").items() if r in ranks]
    for s in steps:
        if s != steps[0]:
            tokens += sum(n for r, n in history.metric(gen, s, "tokens").items() if r in ranks)
            waited += sum(w for r, w in history.metric(gen, s, "wait_s").items() if r in ranks)
    wall = ends[steps[-1]] - ends[steps[0]]
    seconds = wall * _share_left(history, gen, steps[1:], wall)
    return RoleRate(tokens, seconds, len(steps), min(1.0, waited / (wall * len(ranks)))
                    if wall > 0 else 0.0, sum(depths) / len(depths) if depths else None)


def role_work(history: History, gen: int, role: str) -> dict[int, float]:
    """rank -> tokens each rank of ``role`` processed over ``gen``'s committed steps."""
    g = history.generations.get(gen)
    if g is None:
        return {}
    ranks = {r for r, name in enumerate(g.roles) if name == role}
    steps = history.committed(gen)
    if not steps or not ranks:
        return {}
    work = {r: 0.0 for r in ranks}
    for s in steps:
        for r, n in history.metric(gen, s, "tokens").items():
            if r in work:
                work[r] += n
    return work


def _share_left(history: History, gen: int, steps: list[int], wall: float) -> float:
    """The share of the machine's CPUs other processes left to the run during ``steps`` (1.0
    when the workload did not record ``cpu_s``/``busy_s``/``cpus``): a CPU-bound run on a shared
    runner gets only that, so its rate is judged per CPU it could have used."""
    ours = sum(c for s in steps for c in history.metric(gen, s, "cpu_s").values())
    busy_by_rank: dict[int, float] = {}
    cpus = 0.0
    for s in steps:
        for r, b in history.metric(gen, s, "busy_s").items():
            busy_by_rank[r] = busy_by_rank.get(r, 0.0) + b
        cpus = max([cpus, *history.metric(gen, s, "cpus").values()])
    if not busy_by_rank or not cpus or wall <= 0:
        return 1.0
    busy = busy_by_rank[min(busy_by_rank)]   # the machine's clock, read by one rank
    foreign = max(0.0, busy - ours)
    return min(1.0, max(0.25, 1 - foreign / (cpus * wall)))


def _topology_name(roles: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for r in roles:
        counts[r] = counts.get(r, 0) + 1
    return " + ".join(f"{n} {r}" for r, n in counts.items())


def _k(rate: float) -> str:
    return f"{rate / 1000:.1f} Ktok/s"


def throughput(history: History, *, references: Mapping[tuple[str, ...], History] | None = None,
               min_fraction: float | None = None, min_share: float = 0.5) -> Verdict:
    """Each generation's tokens/s per role against a fault-free run of the same topology
    (``references``), failing below a declared ``min_fraction`` of it (undeclared: measured and
    reported only, since a rate over a few short steps on a shared CPU runner swings by 2x);
    and, needing no reference and immune to load, every rank of a role doing at least
    ``min_share`` of the role's mean work, so a pool that silently shrank (ranks alive and idle,
    seed 001's 0% GPUs) fails. The message names the bottleneck: the role that waited least on
    the other."""
    check, replay = "throughput", history.replay
    if not history.has_tokens():
        return Verdict.unknown(check, "the workload recorded no token counts; call "
                               "s.record(tokens=n) in each step", replay=replay)
    measured: list[str] = []
    failures: list[tuple[int, str, int | None]] = []
    worked = 0  # generations whose ranks' shares of the work were judged
    for gen, g in sorted(history.generations.items()):
        rates = {role: rate for role in dict.fromkeys(g.roles)
                 if (rate := role_rate(history, gen, role)) is not None}
        topo = _topology_name(g.roles)
        bottleneck = min(rates, key=lambda role: rates[role].wait) if len(rates) > 1 else None
        waits = ", ".join(f"{role}s waited {r.wait:.0%}"
                          + (f" (mean queue depth {r.queue:.1f})" if r.queue is not None else "")
                          for role, r in rates.items())
        why = (f"; bottleneck: {bottleneck} ({waits} of their time on the other role)"
               if bottleneck else "")
        for role in dict.fromkeys(g.roles):  # needs no rate: one committed step is enough
            work = role_work(history, gen, role)
            if not work:
                continue
            worked += 1
            mean = sum(work.values()) / len(work)
            idle = sorted(rank for rank, n in work.items() if n < min_share * mean)
            if idle and len(work) > 1:
                failures.append((gen, f"generation {gen} ({topo}): {role} rank{'s' if len(idle) > 1 else ''} "
                                 f"{', '.join(map(str, idle))} processed "
                                 f"{', '.join(f'{work[i]:.0f}' for i in idle)} tokens while the "
                                 f"{role} ranks averaged {mean:.0f}: the {role} pool silently shrank "
                                 f"to {len(work) - len(idle)} of {len(work)} working ranks{why}",
                                 idle[0]))
        ref = (references or {}).get(tuple(g.roles))
        for role, r in rates.items():
            ref_rate = role_rate(ref, min(ref.generations), role) if ref and ref.generations else None
            if ref_rate is None or ref_rate.rate <= 0:
                measured.append(f"gen {gen} {role} {_k(r.rate)} (no reference)")
                continue
            ratio = r.rate / ref_rate.rate
            measured.append(f"gen {gen} {role} {_k(r.rate)} ({ratio:.0%})")
            if min_fraction is not None and ratio < min_fraction:
                failures.append((gen, f"generation {gen} ({topo}): {role} throughput {_k(r.rate)}, "
                                 f"{ratio:.0%} of the fault-free run's {_k(ref_rate.rate)} at this "
                                 f"topology (declared minimum {min_fraction:.0%}){why}", None))
    details = {"measured": measured}
    if failures:
        gen, text, rank = failures[0]
        if len(failures) > 1:
            text += f" ({len(failures)} findings in all)"
        return Verdict.failed(check, text, rank=rank, generation=gen, details=details,
                              replay=replay)
    if not worked:
        return Verdict.unknown(check, "no generation committed a step", replay=replay)
    bound = (f"every rate at least {min_fraction:.0%} of the clean run's" if min_fraction is not None
             else "no minimum rate declared (min_throughput=)")
    rates_text = "; ".join(measured) or "no generation ran the 3 steps a rate needs"
    return Verdict.passed(check, f"every rank of each role did its share; {bound}: {rates_text}",
                          details=details, replay=replay)


DEFAULT_CHECKS: Mapping[str, Checker] = {
    "no_rewind": no_rewind,
    "loss_continuity": loss_continuity,
    "exactly_once_samples": exactly_once_samples,
    "state_equivalence": state_equivalence,
    "liveness": liveness,
    "poisoned_commit": poisoned_commit,
}


def run_checks(history: History, checks: Mapping[str, Checker] | None = None,
               **inputs: Any) -> list[Verdict]:
    """Run each checker with the keyword inputs it accepts (``reference=``, ``spread=``, ...).

    A checker that raises becomes an ``unknown`` verdict naming the exception, so one broken
    checker cannot hide the others' verdicts.
    """
    out: list[Verdict] = []
    for name, fn in (checks or DEFAULT_CHECKS).items():
        accepted = inspect.signature(fn).parameters
        kwargs = {k: v for k, v in inputs.items() if k in accepted}
        try:
            out.append(fn(history, **kwargs))
        except Exception as e:  # noqa: BLE001 - reported, not swallowed
            out.append(Verdict.unknown(name, f"checker raised {type(e).__name__}: {e}; this is a "
                                       "bug in the checker or a malformed history",
                                       replay=history.replay))
    return out



# -- allocator_fragmentation ---------------------------------------------------------------------
#: Above this, an allocation bigger than the largest free block fails with the memory free (seed 000).
FRAGMENTATION_ALERT = 0.30
#: Less free memory than this in the allocator's pool is not judged: a few MiB split in two reads
#: as 50% fragmented, yet no allocation that matters is refused for it.
FRAGMENTATION_MIN_FREE = 64 * 2 ** 20


def allocator_fragmentation(history: History, *, threshold: float = FRAGMENTATION_ALERT) -> Verdict:
    """No rank's CUDA caching allocator was more than ``threshold`` fragmented (1 - largest free
    block / total free, from ``telemetry.record_allocator``). On CPU there is no such allocator:
    unknown, saying so, never a pass."""
    check, replay = "allocator_fragmentation", history.replay
    samples = [e for e in history.rank_events("note") if e.get("what") == "allocator"]
    if not samples:
        scenario = next((e for e in history.events if e["ev"] == "scenario"), {})
        why = ("the workload recorded no allocator statistics: call "
               "telemetry.record_allocator(run) after a step or a save"
               if scenario.get("backend") == "nccl" else
               f"not applicable: the run used no CUDA device (backend {scenario.get('backend', '?')})"
               ", and only CUDA's caching allocator fragments this way")
        return Verdict.unknown(check, why, replay=replay)
    mib = 2 ** 20
    judged = [e for e in samples if int(e["total_free"]) >= FRAGMENTATION_MIN_FREE]
    if not judged:
        most = max(int(e["total_free"]) for e in samples)
        return Verdict.passed(check, f"{len(samples)} samples; the allocator never held more than "
                              f"{most / mib:.0f} MiB free (under {FRAGMENTATION_MIN_FREE / mib:.0f} "
                              "MiB, too little for fragmentation to refuse an allocation)",
                              replay=replay)
    worst = max(judged, key=lambda e: float(e["fragmentation"]))
    step = worst.get("step")
    where = f"rank {worst['rank']} (generation {worst['gen']}" + \
        (f", step {step})" if step is not None else ")")
    text = (f"{where}: allocator {float(worst['fragmentation']):.0%} fragmented, largest free "
            f"block {worst['largest_free'] / mib:.0f} MiB of {worst['total_free'] / mib:.0f} MiB "
            f"free in {worst.get('free_blocks', '?')} pieces")
    details = {"samples": len(samples), "judged": len(judged), "worst": {k: worst.get(k) for k in (
        "rank", "gen", "step", "fragmentation", "largest_free", "total_free", "reserved")}}
    if float(worst["fragmentation"]) > threshold:
        return Verdict.failed(check, f"{text}: above {threshold:.0%}, so an allocation bigger than "
                              f"{worst['largest_free'] / mib:.0f} MiB fails although the memory is "
                              "free; try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                              rank=worst["rank"], generation=worst["gen"], step=step,
                              details=details, replay=replay)
    return Verdict.passed(check, f"worst of {len(judged)} samples: {text}, within "
                          f"{threshold:.0%}", details=details, replay=replay)
