"""state_equivalence: the state just after each load equals what was saved (or read).

Each rank's load of a step is compared, component by component, with what was saved for that
step in an earlier generation (or, when nothing was, with the load's own ``expected`` digest):

- a **replicated** component (the default: a model or optimizer under DDP, saved by rank 0 alone)
  with what the lowest rank that saved it recorded;
- a **per-rank** component (declared with ``per_rank=`` at ``checkpoint_saved`` or
  ``checkpoint_loaded``: a rank's own RNG stream, its ZeRO shard) with what *that* rank saved.

A component loaded but never saved (by any rank, or for a per-rank one by that rank), or saved
but never loaded back (an EMA saved and not restored), fails naming component, rank and step. A
rank killed inside its save never records the save; its per-rank state is then compared with
what it recorded it was about to write (``checkpoint_saving``), and without that record it is
``unknown``.

At a shrink the leaving ranks' per-rank state is loaded by no rank unless a survivor took it
over, and digests cannot tell whether that lost anything (a data position per rank may or may
not be implied by the survivors'): such a component is ``unknown``, naming what was dropped. An
RNG stream is the exception: it cannot be carried to another world size, so its drop is only
said in the verdict (``details["dropped"]``), not held against the run.

The load digest means something only at the restore: it must be taken right after the state is
restored and before anything draws from it. The check takes the earliest load digest a rank
recorded for a step and component, and does not fail what it cannot attribute to the restore: a
difference in a digest recorded after the rank began a step, or one in the RNG alone at a resume
that starts a new epoch (a data loader draws from the RNG to build the epoch's iterator), is
``unknown``, saying how to record it so that it can be checked.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from pytest_reshard.checkers._text import _fault_before, _previous, _summarise
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.contract import FileOp
from pytest_reshard.history import LOAD, SAVE, SAVING, Checkpoint, History
from pytest_reshard.verdict import Verdict

_ADVICE = ("call run.checkpoint_saved(step, digest) and run.checkpoint_loaded(step, digest) with "
           "probe.digest() of each component (model, optimizer, lr_schedule, data, rng)")


@dataclass
class _Record:
    """One rank's save or load of one step in one generation, its events merged."""

    gen: int
    rank: int
    step: int
    digest: dict[str, str] = field(default_factory=dict)
    per_rank: set[str] = field(default_factory=set)
    expected: dict[str, str] = field(default_factory=dict)
    late: set[str] = field(default_factory=set)  # components recorded after the rank began a step
    at_restore: bool = False  # the workload says the digest was taken at the restore itself
    source: str = ""          # the workload's word for where a load came from ("live", a heal)
    index: int = -1           # the history position of its first (a load) or last (a save) event


def _per_rank(c: Checkpoint) -> set[str]:
    declared = c.info.get("per_rank") or ()
    return {str(x) for x in ([declared] if isinstance(declared, str) else declared)}


def _is_rng(component: str) -> bool:
    """A random stream's state (``rng``, ``cuda_rng_state``, ``torch_random_state``,
    ``generator``); not a sampler's or a data generator's position."""
    return re.fullmatch(r"(\w+_)?(rng|random|generator)(_state)?", component.lower()) is not None


def _group(history: History, kind: str, *, earliest: bool) -> dict[tuple[int, int, int], _Record]:
    """(gen, rank, step) -> the merged record; ``earliest``: a component recorded twice keeps
    its first digest (a load), else its last (a save: the last one written is on disk)."""
    # A rank's file may hold several incarnations (membership mode restarts a group inside a
    # generation): "began a step" means since the incarnation's own start.
    def began_before(c: Checkpoint) -> bool:
        return history.began_since_start(c.gen, c.rank, c.index)

    out: dict[tuple[int, int, int], _Record] = {}
    for c in history.checkpoints(kind):
        key = (c.gen, c.rank, c.step)
        rec = out.setdefault(key, _Record(c.gen, c.rank, c.step, index=c.index))
        if not earliest:
            rec.index = c.index
        rec.per_rank |= _per_rank(c)
        rec.at_restore |= str(c.info.get("digest_at", "")).startswith("restore")
        source = str(c.info.get("source") or "")
        rec.source = (rec.source or source) if earliest else (source or rec.source)
        if not c.digest and not c.expected:
            continue
        late = began_before(c)
        for comp, d in c.digest.items():
            if not earliest or comp not in rec.digest:
                rec.digest[comp] = d
                (rec.late.add if late else rec.late.discard)(comp)
        for comp, d in (c.expected or {}).items():
            rec.expected.setdefault(comp, d)
    return out


def _epoch_starts_at(history: History, gen: int, step: int) -> bool:
    """The resume at ``step`` in ``gen`` begins a new pass over the data: its samples' recorded
    epoch (``s.record(epoch=...)``) is higher than the step before's, or, with no epochs
    recorded, its samples repeat ones consumed since the last repeat before it (the pass that
    ended at ``step - 1``)."""
    def pairs(g: int, s: int) -> set[tuple[int, int]]:
        return {p for ps in history.samples(g, s).values() for p in ps}

    now = pairs(gen, step)
    if not now:
        return False
    kept = {o.step: o for o in history.kept() if o.step < step}
    before = pairs(kept[step - 1].gen, step - 1) if step - 1 in kept else set()
    if not before:
        return False
    epochs_now, epochs_before = {e for e, _ in now}, {e for e, _ in before}
    if epochs_now != {0} or epochs_before != {0}:
        return min(epochs_now) > max(epochs_before)
    seen: set[tuple[int, int]] = set()
    for s in range(step - 1, -1, -1):      # back over the pass that ended at step - 1
        got = pairs(kept[s].gen, s) if s in kept else set()
        if not got or got & seen:
            break
        seen |= got
    return bool(now & seen)


def _same_state_of_another_step(load: _Record, saves: dict[tuple[int, int, int], _Record]
                                ) -> tuple[int, list[str]] | None:
    """(step, components) of an earlier generation's save of another step whose state the load
    holds exactly, if any. Only components that change from step to step (two saves of different
    steps differ) count: an unchanged one cannot tell two steps apart."""
    steps_of: dict[str, dict[str, set[int]]] = {}  # component -> digest -> steps saved with it
    for (_, _, st), save in saves.items():
        for comp, d in save.digest.items():
            steps_of.setdefault(comp, {}).setdefault(d, set()).add(st)
    evolving = {c for c, by in steps_of.items() if len({st for sts in by.values() for st in sts}) > 1
                and len(by) > 1}
    for (g, _, st), save in sorted(saves.items(), key=lambda kv: -kv[0][2]):
        if g >= load.gen or st == load.step:
            continue
        common = sorted(set(save.digest) & set(load.digest))
        if common and all(save.digest[c] == load.digest[c] for c in common) and \
                evolving & set(common):
            return st, common
    return None


def _being_saved(begun: Mapping[tuple[int, int, int], _Record],
                 saves: Mapping[tuple[int, int, int], _Record],
                 load: _Record) -> tuple[tuple[int, int, int], _Record] | None:
    """The newest save of the load's step an earlier generation began and never recorded as
    done (``checkpoint_saving`` without ``checkpoint_saved``): the load's rank's own first."""
    pool = [(k, b) for k, b in begun.items()
            if k[2] == load.step and k[0] < load.gen and k not in saves]
    if not pool:
        return None
    return max(pool, key=lambda kb: (kb[0][0], kb[0][1] == load.rank))


def state_equivalence(history: History) -> Verdict:
    """The state just after each load equals what was saved (or read), component by component:
    replicated components against any rank's save, per-rank ones against the same rank's."""
    check = "state_equivalence"
    never = history.never_started()
    if never is not None and not history.checkpoints():
        return Verdict.unknown(check, never)
    gens = history.generations
    first_gen = min(gens, default=0)
    loads = {k: r for k, r in _group(history, LOAD, earliest=True).items()
             if r.digest or r.expected}
    every_save = _group(history, SAVE, earliest=False)
    begun = {k: r for k, r in _group(history, SAVING, earliest=False).items() if r.digest}
    saves = {k: r for k, r in every_save.items() if r.digest}
    savers: dict[tuple[int, int], set[int]] = {}   # (gen, step) -> ranks that recorded a save
    for g, r, st in every_save:
        savers.setdefault((g, st), set()).add(r)
    resumed = [g for g in gens.values() if g.gen != first_gen and (g.resume_step or 0) > 0]
    loaded_gens = {gen for gen, _, _ in loads}
    unverified = [f"generation {g.gen} resumed at step {g.resume_step} without recording a load "
                  "digest" for g in resumed if g.gen not in loaded_gens]
    mismatches: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []   # loaded never saved, saved never loaded back
    excused: list[str] = []              # differences the restore may not have caused
    dropped: list[str] = []              # leaving ranks' per-rank state nobody loaded (a shrink)
    dropped_rng: list[str] = []          # the same of an RNG stream: said, not held against it
    verified = 0
    def before(load: _Record) -> dict[tuple[int, int, int], _Record]:
        """The saves a load may have read: of an earlier generation, or in membership mode
        (a heal from a live peer) of the same generation, recorded before the load."""
        pool = {k: s for k, s in saves.items() if k[2] == load.step and (
            k[0] < load.gen or (member and k[0] == load.gen and s.index < load.index))}
        donors = {k: s for k, s in pool.items() if k[0] == load.gen and "donor" in s.source}
        if "heal" in load.source and donors:  # the peer that sent it: the last donor before
            k = max(donors, key=lambda k: donors[k].index)
            return {k: donors[k]}
        return pool

    member = history.replica_groups is not None
    for (gen, rank, step), load in sorted(loads.items()):
        earlier = before(load)
        if not load.digest:
            continue   # this rank recorded what it read, not what it loaded: nothing to compare
        if not earlier:
            if load.expected:
                baseline: dict[str, tuple[str, str, int | None]] = {
                    c: (d, "read (the load's expected digest)", None) for c, d in load.expected.items()}
                common = sorted(set(baseline) & set(load.digest))
                if not common:
                    unverified.append(f"the load of step {step} in generation {gen} (rank {rank}) "
                                      "shares no component with its expected digest")
                    continue
                verified += 1
                _compare(history, load, common, baseline, None, mismatches, excused)
            elif gen != first_gen and (unfinished := _being_saved(begun, saves, load)):
                # no rank recorded that save as done, but one began it: compare with what it was
                # writing (killed after the save's last write, before its record)
                (wg, wr, _), rec = unfinished
                baseline = {c: (d, f"being saved by rank {wr} in generation {wg} (a save it "
                                   "never recorded as done)", wg) for c, d in rec.digest.items()}
                common = sorted(set(baseline) & set(load.digest))
                if common:
                    verified += 1
                    _compare(history, load, common, baseline, None, mismatches, excused)
                else:
                    unverified.append(f"the load of step {step} in generation {gen} (rank "
                                      f"{rank}) shares no component with the save rank {wr} "
                                      f"began in generation {wg}")
            elif gen != first_gen:
                cut = [f for f in history.faults_fired() if f.gen < gen and f.step == step
                       and f.phase in ("checkpoint", "checkpoint_commit")]
                if cut:
                    text = (f"the load of step {step} in generation {gen} read a save that never "
                            f"completed (generation {cut[0].gen} was killed in step {step} at its "
                            f"{cut[0].phase} point): no saved digest to compare with (see "
                            "no_rewind)")
                    if text not in unverified:
                        unverified.append(text)
                else:
                    older = _same_state_of_another_step(load, saves)
                    if older is None:
                        unverified.append(f"the load of step {step} in generation {gen} (rank "
                                          f"{rank}) has no earlier save of step {step} and no "
                                          "expected digest (a crash after the save's last write, "
                                          "before its record? record run.checkpoint_saving(step, "
                                          "state=...) as the save begins)")
                        continue
                    other, comps = older
                    mismatches.append({
                        "message": f"the load in generation {gen} claims step {step} but holds "
                                   f"what was saved for step {other} ({', '.join(comps)} equal, bit "
                                   f"for bit, on rank {rank}), and no save of step {step} was "
                                   "recorded: the checkpoint is labelled with a later step than "
                                   "its state (a save that reads the step after the state was "
                                   "taken, as an asynchronous save's finalize can)",
                        "differ": comps, "step": step, "rank": rank, "gen": gen})
            continue
        per_rank = set(load.per_rank).union(*(s.per_rank for s in earlier.values()))
        src_gen = max(g for g, _, _ in earlier)
        baseline = {}
        for comp in load.digest:
            if comp in per_rank:
                mine = sorted((g for g, r, _ in earlier if r == rank and comp in
                               earlier[(g, r, step)].digest), reverse=True)
                writing = sorted((g for (g, r, st), b in begun.items() if r == rank and st == step
                                  and g < gen and comp in b.digest and (g, r, st) not in saves),
                                 reverse=True)   # began that save, never recorded its end
                if mine:
                    baseline[comp] = (earlier[(mine[0], rank, step)].digest[comp],
                                      f"saved by rank {rank} in generation {mine[0]}", mine[0])
                elif writing:
                    # it began writing that save and never recorded its end: compare with what
                    # it was writing (a file it never finished cannot hold it)
                    baseline[comp] = (begun[(writing[0], rank, step)].digest[comp],
                                      f"being saved by rank {rank} in generation {writing[0]} "
                                      "(a save it never recorded as done)", writing[0])
                elif _killed_while_writing(history, rank, gen, step):
                    # killed at a file event of that save after it had written files: its
                    # record of the save is missing, its file may not be
                    text = (f"rank {rank} loaded its {comp} for step {step} in generation {gen}, "
                            f"but it was killed inside that save, after writing files of it "
                            f"and before it recorded the save: no saved digest to compare with "
                            f"(crash_consistency judges the files)")
                    if text not in unverified:
                        unverified.append(text)
                else:
                    others = sorted({r for (g, r, _), s in earlier.items() if comp in s.digest})
                    by = (f"; rank{'s' if len(others) > 1 else ''} "
                          f"{', '.join(map(str, others))} saved theirs" if others else "")
                    missing.append({
                        "message": f"{comp} (per-rank) was loaded by rank {rank} in generation "
                                   f"{gen} for step {step}, but rank {rank} never saved its "
                                   f"{comp} for step {step}{by}: what it restored is not its own "
                                   "saved state (its per-rank file is missing from the "
                                   "checkpoint, never written or cut short by the rank's death, "
                                   "and the checkpoint was still used)",
                        "step": step, "rank": rank, "generation": gen, "component": comp})
                continue
            holders = sorted((g, r) for (g, r, _), s in earlier.items() if comp in s.digest)
            if holders:
                g_latest = max(g for g, _ in holders)
                r_low = min(r for g, r in holders if g == g_latest)
                baseline[comp] = (earlier[(g_latest, r_low, step)].digest[comp],
                                  f"saved in generation {g_latest}", g_latest)
            else:
                saved = ", ".join(sorted(set().union(*(s.digest for s in earlier.values()))))
                missing.append({
                    "message": f"{comp} was loaded by rank {rank} in generation {gen} for step "
                               f"{step}, but no rank saved {comp} for step {step} (saved: "
                               f"{saved or 'nothing'}): "
                               f"its restored state cannot be what was saved; record it at the "
                               "save too (the same component name at save and load)",
                    "step": step, "rank": rank, "generation": gen, "component": comp})
        common = sorted(baseline)
        if not common:
            continue
        verified += 1
        _compare(history, load, common, baseline, src_gen, mismatches, excused, saves=saves,
                 savers=savers)
    # Saved but never loaded back: compared per loading generation.
    for gen, step in sorted({(g, s) for g, _, s in loads}):
        last = max((l for (g, _, s), l in loads.items() if g == gen and s == step),
                   key=lambda l: l.index)
        earlier = before(last)
        if not earlier:
            continue
        src_gen = max(g for g, _, _ in earlier)
        src = {k: s for k, s in earlier.items() if k[0] == src_gen}
        by_rank = {r: l for (g, r, s), l in loads.items() if g == gen and s == step}
        per_rank = set().union(*(s.per_rank for s in earlier.values()),
                               *(l.per_rank for l in by_rank.values()))
        world = gens[gen].world_size if gen in gens else 0
        loaded_any = set().union(*(l.digest for l in by_rank.values()))
        reported: set[str] = set()
        left: dict[str, list[int]] = {}   # per-rank component -> leaving ranks nobody took it from
        for (_, r, _), s in sorted(src.items()):
            for comp in sorted(s.digest):
                if comp in per_rank:
                    if r >= world and by_rank and not any(
                            l.digest.get(comp) == s.digest[comp] for l in by_rank.values()):
                        left.setdefault(comp, []).append(r)
                    if r >= world or r not in by_rank or comp in by_rank[r].digest:
                        continue   # that rank is gone (a shrink), recorded no load, or loaded it
                    who, loaded = f"rank {r}", ", ".join(sorted(by_rank[r].digest))
                elif comp in loaded_any or comp in reported:
                    continue
                else:
                    who, loaded = "any rank", ", ".join(sorted(loaded_any))
                    reported.add(comp)
                missing.append({
                    "message": f"{comp}{' (per-rank)' if comp in per_rank else ''} was saved by "
                               f"rank {r} in generation {src_gen} for step {step} but never "
                               f"loaded back by {who} in generation {gen}, which loaded only "
                               f"{loaded or 'nothing'}: restore it with the rest of the state "
                               "(or stop saving it), and record its digest at the load",
                    "step": step, "rank": r if comp in per_rank else None, "generation": gen,
                    "component": comp})
        for comp, ranks in sorted(left.items()):
            (dropped_rng if _is_rng(comp) else dropped).append(
                _dropped(comp, ranks, src_gen, gen, step, gens[src_gen].world_size
                         if src_gen in gens else None, world))
    details: dict[str, Any] = {"loads_verified": verified, "unverified": unverified,
                               "mismatches": len(mismatches), "missing": len(missing),
                               "excused": excused, "dropped": dropped + dropped_rng}
    if mismatches:
        # A rank's own state that differs says which rank went wrong; lead with it.
        m = next((x for x in mismatches if x.get("own")), mismatches[0])
        details["differ"] = m["differ"]
        text = m["message"]
        rest = [x["message"] for x in mismatches if x is not m] + [x["message"] for x in missing]
        if len(mismatches) > 1:
            text += f" ({len(mismatches)} mismatching loads in all)"
        if missing:
            text += f"; also: {_summarise([x['message'] for x in missing])}"
        details["problems"] = [m["message"], *rest]
        return Verdict.failed(check, text, step=m["step"], rank=m["rank"], generation=m["gen"],
                              fault=_fault_before(history, m["gen"]), details=details)
    if missing:
        x = missing[0]
        details["problems"] = [p["message"] for p in missing]
        details["component"] = x["component"]
        return Verdict.failed(check, _summarise([p["message"] for p in missing]), step=x["step"],
                              rank=x["rank"], generation=x["generation"],
                              fault=_fault_before(history, x["generation"]), details=details)
    if excused or dropped:
        return Verdict.unknown(check, _summarise(excused + dropped), details=details)
    if unverified:
        undigested = sorted({n for c in history.checkpoints()
                             for n in c.info.get("undigested") or ()})
        advice = (f"record mode took no digest of the state it was given ({', '.join(undigested)}):"
                  " turn digests on with RESHARD_RECORD_DIGESTS=1 or probe.attach(record=..., "
                  "digests=True)" if undigested else _ADVICE)
        return Verdict.unknown(check, f"{_summarise(unverified)}; {advice}", details=details)
    if verified:
        note = f"; {_summarise(dropped_rng)}" if dropped_rng else ""
        return Verdict.passed(check, f"{verified} loads match what was saved, component by "
                              f"component{note}", details=details)
    if len(gens) <= 1:
        return Verdict.passed(check, "single generation: no reshard to check", details=details)
    last_saved = {g.gen: max((st for gn, st in savers if gn < g.gen), default=None)
                  for g in gens.values() if g.gen != first_gen and not g.resume_step}
    ignored = [f"generation {gen} started at step 0 although step {step} was saved before it"
               for gen, step in last_saved.items() if step is not None]
    if ignored:  # a state that was there to load, and was not: nothing here says it survives
        return Verdict.unknown(check, f"{_summarise(ignored)}: nothing was loaded, so no state "
                               "to compare (no_rewind judges the restart)", details=details)
    return Verdict.passed(check, "no generation resumed from saved state (each started at step 0, "
                          "before any save): no state to compare", details=details)


def _dropped(comp: str, ranks: list[int], src_gen: int, gen: int, step: int,
             old_world: int | None, world: int) -> str:
    """The sentence for a leaving rank's per-rank ``comp`` that no rank of ``gen`` loaded."""
    who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    sizes = f" (world size {old_world} -> {world})" if old_world is not None else ""
    head = (f"{comp} (per-rank) saved by {who} in generation {src_gen} for step {step} was loaded "
            f"by no rank of generation {gen}{sizes}: it left with {who} at the shrink")
    if _is_rng(comp):
        return (f"{head} (a random stream is not carried to another world size; the clean run at "
                f"{world} ranks is the reference)")
    return (f"{head}, and digests cannot tell whether that lost anything (a survivor may imply "
            f"it, or not): save it consolidated (one replicated component, e.g. the global data "
            f"position) so any world size resumes it, or record sample ids so that "
            f"exactly_once_samples judges the data")


def _compare(history: History, load: _Record, common: list[str],
             baseline: dict[str, tuple[str, str, int | None]], src_gen: int | None,
             mismatches: list[dict[str, Any]], excused: list[str],
             saves: dict[tuple[int, int, int], _Record] | None = None,
             savers: dict[tuple[int, int], set[int]] | None = None) -> None:
    differ = [c for c in common if baseline[c][0] != load.digest[c]]
    gen, rank, step = load.gen, load.rank, load.step
    late = [c for c in differ if c in load.late]
    if late:
        excused.append(f"{' and '.join(late)} differ{'s' if len(late) == 1 else ''} after the "
                       f"load of step {step} in generation {gen} on rank {rank}, but that digest "
                       "was recorded after the rank began a step, so the state had moved on from "
                       "the restore: call run.checkpoint_loaded right after the restore, before "
                       "the first step")
        differ = [c for c in differ if c not in late]
    if not differ:
        return
    if all(_is_rng(c) for c in differ) and not load.at_restore and \
            _epoch_starts_at(history, gen, step + 1):
        excused.append(f"{' and '.join(differ)} differ{'s' if len(differ) == 1 else ''} after the "
                       f"load of step {step} in generation {gen} on rank {rank}, and step "
                       f"{step + 1} starts a new epoch: a data loader that draws from the RNG to "
                       "build the epoch's iterator changes it between the restore and the first "
                       "step, so this cannot be told from an RNG that was not restored; take the "
                       "load digest right after the restore (before iter(dataloader)) to check it")
        return
    gens = history.generations
    src = gens.get(src_gen) if src_gen is not None else _previous(history, gen)
    dst = gens.get(gen)
    sizes = f" (world size {src.world_size} -> {dst.world_size})" if src and dst else ""
    resharded = bool(src and dst and src.world_size != dst.world_size)
    kind = "resharded load" if resharded else "load"
    comps = " and ".join(differ)
    verb = "differs" if len(differ) == 1 else "differ"
    digests = ", ".join(f"{c}: {baseline[c][0]} -> {load.digest[c]}" for c in differ)
    sources = sorted({baseline[c][1] for c in differ})
    source = (f"what was {sources[0]}" if len(sources) == 1 else
              "what was saved (" + "; ".join(f"{c} {baseline[c][1]}" for c in differ) + ")")
    hint = _hint(history, load, differ[0], src_gen, resharded, saves or {}, savers or {})
    message = (f"{comps} state {verb} after the {kind} of step {step} in generation {gen}{sizes} "
               f"on rank {rank}: {source} does not match what was loaded ({digests}); {hint}")
    mismatches.append({"message": message, "differ": differ, "step": step, "rank": rank,
                       "gen": gen, "own": set(differ) <= load.per_rank})


def _hint(history: History, load: _Record, comp: str, src_gen: int | None, resharded: bool,
          saves: dict[tuple[int, int, int], _Record],
          savers: dict[tuple[int, int], set[int]]) -> str:
    """What to look at, from what the history shows (who saved, at which world sizes)."""
    got = load.digest[comp]
    # The evidence first: the loaded state is some other saved state.
    for (g, r, s), rec in sorted(saves.items(), key=lambda kv: (-kv[0][2], kv[0][0], kv[0][1])):
        if rec.digest.get(comp) == got and rec.index < load.index and \
                (s != load.step or r != load.rank):   # a save made after the load explains nothing
            if s != load.step:
                return (f"what was loaded is the {comp} saved for step {s} (generation {g}, rank "
                        f"{r}): the load read another step's checkpoint, or a file the step-"
                        f"{load.step} save did not rewrite")
            return (f"what was loaded is the {comp} rank {r} saved: ranks read each other's "
                    "per-rank files (name them by rank, and at a new world size decide which "
                    "rank takes which)")
    if src_gen is None:
        return ("the state loaded is not what the checkpoint holds: restore every component into "
                "the objects being trained")
    if load.source == "live" or "heal" in load.source:
        how = "handed over in memory (a live reshard)" if load.source == "live" else \
            "sent by a live peer (a heal)"
        return (f"the {comp} was {how} and rank {load.rank} holds something else: check that it "
                "received the state and copied every tensor into the objects that train "
                "(sharded state: which rows each rank cuts from the old shards for its new ones)")
    recorded = [saves[k] for k in saves if k[0] == src_gen and k[2] == load.step]
    digests = {rec.digest.get(comp) for rec in recorded} - {None}
    per_rank = comp in load.per_rank or any(comp in rec.per_rank for rec in recorded)
    savers_ = sorted(savers.get((src_gen, load.step), ()))
    where = "at a new world size" if resharded else "at the same world size"
    if _is_rng(comp):
        return (f"each rank saved its own RNG state; rank {load.rank} loaded {where} holds "
                "another: a rank that looks for its file under another name (one file per rank "
                "at one world size, one file at another) keeps the RNG it was seeded with")
    if per_rank or len(digests) > 1:
        return (f"each rank saved its own {comp} (per-rank state, a ZeRO-style shard); loaded "
                f"{where} it must come back to the rank it belongs to"
                + (": a shard partitioned for the old world size is not this rank's shard now: "
                   "consolidate it before saving (and digest the consolidated state), or "
                   "re-partition it on load" if resharded else ""))
    if len(savers_) == 1:
        r = savers_[0]
        base = (f"rank {r} saved the {comp} alone (a full, replicated copy) and rank "
                f"{load.rank} loaded something else")
        if comp == "model":
            return (f"{base}: load that state dict into the model that trains (the module inside "
                    "DDP), after any wrapping, from the file of this step")
        if comp == "optimizer":
            return (f"{base}: restore it with optimizer.load_state_dict(saved) once the optimizer "
                    "exists over the parameters that train; a fresh optimizer has empty state")
        return f"{base}: save it with the checkpoint and restore it on load"
    # Every rank took part in the save (a collective, sharded save such as DCP).
    if comp == "model":
        return (f"every rank took part in saving it (a sharded save) and it was loaded {where}: "
                "the parameters did not round-trip; compare how they are sharded at save and at "
                "load (device mesh, placements)")
    if comp == "optimizer":
        return (f"every rank took part in saving it (a sharded save) and it was loaded {where}: "
                "the raw optimizer.state_dict() of a sharded model is not the whole state (save "
                "and load it through torch.distributed.checkpoint.state_dict's get_state_dict/"
                "set_state_dict); where it already is, compare how its state is sharded at save "
                "and at load, and whether the optimizer it is loaded into is the one that steps")
    return (f"the checkpoint does not round-trip it {where}: save it with the checkpoint and "
            "restore it on load")


@register("state_equivalence", column="state", assertion="assert_state_equivalent",
          description="the state loaded after each reshard equals the state saved before it, "
                      "component by component")
def _check(ctx: CheckContext) -> Verdict:
    return state_equivalence(ctx.history)


def _killed_while_writing(history: History, rank: int, gen: int, step: int) -> bool:
    """``rank`` was killed inside a save of ``step`` or later, in a generation before ``gen``,
    after it had written files of that save: at a file event after a ``close``, or at the save's
    ``checkpoint_commit`` point (its files written, the save not yet recorded: a framework's
    callback records a save only once the whole save returned)."""
    if any(f.rank == rank and f.gen < gen and f.step == step and f.phase == "checkpoint_commit"
           for f in history.faults_fired()):
        return True
    closed = False
    for e in history.file_events():
        if e.rank != rank or e.gen >= gen or (e.at_step or -1) < step:
            continue
        if e.killed:
            return closed
        closed = closed or e.op == FileOp.CLOSE
    return False
