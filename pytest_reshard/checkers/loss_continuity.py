"""loss_continuity: each kept step's loss matches a clean run that fits the way it was reached.

Every kept step belongs to a generation; the generation's *path* is the set of topologies (roles
per rank) of the generations whose kept steps made the state it started from, plus its own. Each
step is judged against the clean run (same workload, seed and data, no faults) at its own
generation's topology:

- **One topology on the path** (the run never left it: generation 0, a kill or preemption that
  came back at the same size, a rebalance): the same computation as the clean run, so the loss
  must match it bit for bit, up to ``SAME_SIZE_FLOOR * |loss|`` (ten float32 roundings: a resume
  may still change a reduction's order, as when a rank's share moves to a peer). Generation 0's
  steps before the first fault are a repeat of the clean run for free: where they differ, the
  workload is not deterministic at one size (NCCL, atomics, threads), the same-size floor is
  ``SPREAD_FACTOR`` times the largest measured difference, and beyond it the verdict is
  ``unknown`` rather than fail. With no such steps a gloo run is taken as bit-exact, others not.
- **Several topologies on the path** (a reshard): reduction order differs, so the floor at step
  ``s`` is the running maximum, up to ``s``, of the difference between the clean runs at the
  path's topologies, and the tolerance is ``SPREAD_FACTOR`` floors. That floor only means
  something while those clean runs *agree*: their difference may grow as reduction-order noise
  does (``AGREE_GROWTH`` times the largest so far, plus ``AGREE_UPDATE`` of what the loss moved
  that step, plus ``AGREE_ROUNDING * |loss|``); beyond that (an LR scaled by the world size, a
  global batch that changes with it, dropout drawn per rank, a loss-scaler overflow at one size
  only) they have *diverged*, and from that step on the floor stops growing. A step after the
  divergence that still tracks its own topology's clean run within the floor measured before it
  passes; one that does not is ``unknown``, never pass and never fail, with what to change.
- **A jump at a resume point**: a resumed generation's first loss may not move from the previous
  kept step's by more than the clean runs ever moved between two consecutive steps (plus the
  step's tolerance and, across sizes, how far apart the clean runs are there and were before
  any update). That is a fail whatever the floors say: a person looking at the chart would
  call it broken.

The pure function takes the clean runs as histories; the registered checker asks the check
context for one clean run per topology on the run's paths (``CheckContext.clean_reference``).
"""
from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Iterable, Mapping, NamedTuple

from pytest_reshard.checkers._text import _fault_before, _ranges
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History, Occurrence
from pytest_reshard.verdict import Verdict

#: Across world sizes, a deviation beyond this many noise floors fails loss_continuity. The
#: floor is the largest difference seen between two clean runs so far, and a run that crossed
#: topologies may land a few times beyond it; state bugs measured here are 10^3-10^6 floors away.
SPREAD_FACTOR = 10.0
#: One float32 rounding of the loss, relative to |loss| (eps = 1.19e-7): the smallest floor
#: across sizes (whose tolerance is SPREAD_FACTOR of them).
ROUNDING_FLOOR = 1e-7
#: The floor, and tolerance, of a step the run reached without leaving its size on a
#: deterministic backend, relative to |loss|: ten float32 roundings. The same computation gives
#: the same bits; a resume that moves a rank's share to a peer changes a reduction's order (a
#: rounding or two, measured on the bundled pipeline); real restore bugs are 1e-3 and more.
SAME_SIZE_FLOOR = SPREAD_FACTOR * ROUNDING_FLOOR
#: Clean runs at two topologies still *agree* at a step while their difference is at most
#: AGREE_GROWTH x the largest difference so far + AGREE_UPDATE x what their loss moved in that
#: step + AGREE_ROUNDING x |loss|. Reduction order perturbs an update by float rounding (2^-24 in
#: float32, 2^-11 in float16, far below 1%), a hyperparameter that depends on the world size
#: perturbs it by tens of percent, and a first loss (no update yet) differs by rounding only.
AGREE_GROWTH = 10.0
AGREE_UPDATE = 1e-2
AGREE_ROUNDING = 1e-5

Topology = tuple  # the role of each rank, in rank order


def topology_name(topology: Topology) -> str:
    """``4 ranks`` or ``2 target + 2 drafter``."""
    counts = Counter(topology)
    if len(counts) <= 1:
        return f"{len(topology)} rank{'s' if len(topology) != 1 else ''}"
    return " + ".join(f"{n} {role}" for role, n in counts.items())


def _losses(history: History) -> dict[int, float]:
    return {s: loss for s, (_, loss) in history.kept_losses().items() if math.isfinite(loss)}


def _topology_of(history: History) -> Topology:
    gens = history.generations
    if gens:
        return tuple(gens[min(gens)].roles)
    return (tuple(["trainer"] * history.scenario.world_size) if history.scenario else ())


def measure_spread(reference_a: History, reference_b: History, *more: History) -> float:
    """The largest per-step loss difference between clean runs, over every pair and every step
    both kept. A summary for people: ``loss_continuity`` no longer applies one run-wide number to
    every step (see ``agreement`` for the per-step floor it uses)."""
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


@dataclass(frozen=True)
class Agreement:
    """How the clean runs at two topologies compare, step by step.

    ``spread``: their difference at each common step. ``diverged_at``: the first step where it
    grew beyond what reduction order can do (None: never), ``diverged_by`` the difference there
    and ``moved`` what their loss moved in that step. The floor at a step is the running maximum
    of the spread up to it, frozen at the last step before the divergence."""

    a: Topology
    b: Topology
    spread: Mapping[int, float]
    diverged_at: int | None = None
    diverged_by: float = 0.0
    moved: float = 0.0
    _steps: list[int] = field(default_factory=list, repr=False)
    _running: list[float] = field(default_factory=list, repr=False)

    def agrees_at(self, step: int) -> bool:
        return self.diverged_at is None or step < self.diverged_at

    def floor_at(self, step: int) -> float:
        """The largest spread over the steps up to ``step`` on which the runs still agreed."""
        i = bisect.bisect_right(self._steps, step)
        return self._running[i - 1] if i else 0.0

    def describe(self) -> str:
        """``the clean runs at 4 ranks and 3 ranks differ by 1.02 at step 1 (...)``."""
        d = self.diverged_at
        if d is None:
            return (f"the clean runs at {topology_name(self.a)} and {topology_name(self.b)} agree "
                    f"within reduction-order noise (at most {max(self.spread.values(), default=0):.3g})")
        first = min(self.spread) if self.spread else 0
        when = f"from step {d}" if d == first else f"from step {d} on"
        return (f"the clean runs at {topology_name(self.a)} and {topology_name(self.b)} differ by "
                f"{self.diverged_by:.3g} {when}"
                + (f" (their loss moved {self.moved:.3g} in that step" if d != first else
                   " (before any update")
                + "; reduction order alone moves them by float rounding)")


def agreement(a: Topology, a_losses: Mapping[int, float], b: Topology,
              b_losses: Mapping[int, float]) -> Agreement:
    """Compare two clean runs step by step (see the module docstring for the rule)."""
    common = sorted(set(a_losses) & set(b_losses))
    spread = {s: abs(a_losses[s] - b_losses[s]) for s in common}
    steps: list[int] = []
    running: list[float] = []
    top, prev = 0.0, None
    for s in common:
        moved = 0.0 if prev is None else max(abs(a_losses[s] - a_losses[prev]),
                                             abs(b_losses[s] - b_losses[prev]))
        scale = max(abs(a_losses[s]), abs(b_losses[s]))
        allowed = AGREE_GROWTH * top + AGREE_UPDATE * moved + AGREE_ROUNDING * scale
        if spread[s] > allowed:
            return Agreement(a, b, spread, s, spread[s], moved, steps, running)
        top = max(top, spread[s])
        steps.append(s)
        running.append(top)
        prev = s
    return Agreement(a, b, spread, None, 0.0, 0.0, steps, running)


def _largest_move(losses: Mapping[int, float], k: int) -> float:
    """The largest |loss(t) - loss(t - k)| of a clean run."""
    return max((abs(losses[t] - losses[t - k]) for t in losses if t - k in losses), default=0.0)


class _Row(NamedTuple):
    step: int
    occ: Occurrence
    loss: float
    ref: float | None
    topology: Topology
    tol: float          # the largest deviation that passes at this step
    status: str         # "ok", "fail" or "unknown"
    why: str            # "same", "cross", "window", "nondeterministic", "diverged", "noref"
    agreement: Agreement | None = None

    @property
    def dev(self) -> float:
        return abs(self.loss - self.ref) if self.ref is not None else math.inf

    @property
    def units(self) -> float:
        return self.dev / self.tol if self.tol > 0 else math.inf


class _Jump(NamedTuple):
    step: int
    occ: Occurrence
    prev: int
    before: float
    after: float
    allowed: float      # what the clean runs ever moved in (step - prev) steps
    apart: float        # how far apart the clean runs of the path are at this step
    switch: float       # ... and at their first step, before any update
    tol: float


def loss_continuity(history: History, *, references: Iterable[History] | Mapping[Any, History] = (),
                    reference: History | None = None,
                    deterministic: bool | None = None) -> Verdict:
    """Each kept step's loss against the clean run at its generation's topology (module
    docstring). ``references``: clean runs of the same workload, seed and data, one per topology
    the run used (their first generation's roles say which); ``reference``: one more (the old
    single-reference form). ``deterministic``: whether two clean runs at one size agree bit for
    bit (default: measured from generation 0 before its first fault, else True on gloo)."""
    verdict = _judge(history, references=references, reference=reference,
                     deterministic=deterministic)
    reduced = sorted(history.reduced_steps())
    if not reduced or verdict.status == "unknown" or \
            (verdict.status == "fail" and verdict.step is not None and verdict.step < reduced[0]):
        return verdict
    groups = history.replica_groups[0] if history.replica_groups else 0
    what = ("differs from the clean run" if verdict.status == "fail" else
            "matches the clean run where compared")
    return Verdict.unknown(
        verdict.check, f"steps {_ranges(reduced)} were committed by a quorum of fewer than "
        f"{groups} replica groups (a smaller global batch than the clean run's), so the clean run "
        f"cannot judge the losses from step {reduced[0]} on; the run {what}: {verdict.message}",
        step=reduced[0], details={**verdict.details, "reduced_steps": reduced,
                                  "verdict_before": verdict.status})


def _judge(history: History, *, references: Iterable[History] | Mapping[Any, History],
           reference: History | None, deterministic: bool | None) -> Verdict:
    check = "loss_continuity"
    given = [] if isinstance(references, Mapping) else list(references)
    if reference is not None:
        given.insert(0, reference)
    if not given and not (isinstance(references, Mapping) and references):
        return Verdict.unknown(check, "no reference run to compare with: pass references=[History "
                               "of a fault-free run with the same seed and data order at each "
                               "world size the run used]")
    refs: dict[Topology, dict[int, float]] = {}
    if isinstance(references, Mapping):   # keyed by the roles they were asked for
        for key, h in references.items():
            refs.setdefault(tuple(key), _losses(h))
    for h in given:
        refs.setdefault(_topology_of(h), _losses(h))
    if not any(refs.values()) or any(not v for v in refs.values()):
        return Verdict.unknown(check, "the reference run recorded no loss; call "
                               "s.record(loss=loss.item()) in every step")
    run = {s: (occ, loss) for s, (occ, loss) in history.kept_losses().items()}
    if not run:
        return Verdict.unknown(check, "the run recorded no loss for any kept step; call "
                               "s.record(loss=loss.item()) in every step")

    gens = history.generations
    first_gen = min(gens) if gens else min(occ.gen for occ, _ in run.values())

    def topo(gen: int) -> Topology:
        if gen in gens and gens[gen].roles:
            return tuple(gens[gen].roles)
        return next(iter(refs))  # a history without generation records: its only reference

    owners = sorted({occ.gen for occ, _ in run.values()})
    paths: dict[int, tuple[Topology, ...]] = {}
    seen: list[Topology] = []
    for g in owners:
        here = list(seen) + ([topo(g)] if topo(g) not in seen else [])
        paths[g] = tuple(here)
        seen = here
    first_topo = topo(first_gen)
    base = refs.get(first_topo) or next(iter(refs.values()))
    last = max(run)
    gaps = sorted(s for s in base if s not in run and s <= last)
    tail = sorted(s for s in base if s > last)

    # Generation 0 before its first fault is a repeat of the clean run at its topology.
    fault_steps = [f.step for f in history.faults_fired()]
    if history.scenario is not None:
        fault_steps += [int(f["step"]) for f in history.scenario.schedule.get("faults", [])
                        if isinstance(f.get("step"), int)]
    first_fault = min(fault_steps, default=math.inf)
    first_ref = refs.get(first_topo, {})
    window = {s: abs(loss - first_ref[s]) for s, (occ, loss) in run.items()
              if occ.gen == first_gen and s < first_fault and s in first_ref}
    measured_exact = all(d <= ROUNDING_FLOOR * abs(first_ref[s]) for s, d in window.items())
    if window:
        exact = measured_exact
    elif deterministic is not None:
        exact = deterministic
    else:
        exact = (history.scenario.backend if history.scenario else "gloo") == "gloo"
    window_steps = sorted(window)
    window_running: list[float] = []
    for s in window_steps:
        window_running.append(max(window_running[-1] if window_running else 0.0, window[s]))

    agreements: dict[frozenset[Topology], Agreement] = {}

    def pair(a: Topology, b: Topology) -> Agreement:
        key = frozenset((a, b))
        if key not in agreements:
            agreements[key] = agreement(a, refs[a], b, refs[b])
        return agreements[key]

    rows: list[_Row] = []
    for s in sorted(run):
        occ, loss = run[s]
        t = topo(occ.gen)
        path = paths[occ.gen]
        ref = refs.get(t, {}).get(s)
        if ref is None or any(p not in refs for p in path):
            rows.append(_Row(s, occ, loss, ref, t, math.inf, "unknown", "noref"))
            continue
        rounding = max(ROUNDING_FLOOR * abs(ref), 1e-30)
        dev = abs(loss - ref)
        if len(path) == 1:
            if exact:
                tol = max(SAME_SIZE_FLOOR * abs(ref), 1e-30)
                rows.append(_Row(s, occ, loss, ref, t, tol, "fail" if dev > tol else "ok", "same"))
                continue
            if occ.gen == first_gen and s in window:
                rows.append(_Row(s, occ, loss, ref, t, max(rounding, dev), "ok", "window"))
                continue
            i = bisect.bisect_right(window_steps, s)
            noise = window_running[i - 1] if i else 0.0
            tol = max(SAME_SIZE_FLOOR * abs(ref), SPREAD_FACTOR * noise)
            rows.append(_Row(s, occ, loss, ref, t, tol, "unknown" if dev > tol else "ok",
                             "nondeterministic"))
            continue
        pairs = [pair(a, b) for a, b in combinations(path, 2)]
        floor = max([rounding] + [p.floor_at(s) for p in pairs])
        tol = SPREAD_FACTOR * floor
        split = next((p for p in sorted(pairs, key=lambda p: p.diverged_at or 0)
                      if not p.agrees_at(s)), None)
        if dev <= tol:
            rows.append(_Row(s, occ, loss, ref, t, tol, "ok", "cross", split))
        elif split is None:
            rows.append(_Row(s, occ, loss, ref, t, tol, "fail", "cross"))
        else:
            rows.append(_Row(s, occ, loss, ref, t, tol, "unknown", "diverged", split))

    by_step = {r.step: r for r in rows}
    jumps: list[_Jump] = []
    for g in owners[1:]:
        r = min(s for s, (occ, _) in run.items() if occ.gen == g)
        earlier = [s for s in run if s < r]
        if not earlier:
            continue
        p = max(earlier)
        allowed = max(_largest_move(v, r - p) for v in refs.values())
        # where training depends on the world size, the loss at r may also be as far from the
        # previous size's as the clean runs at the two sizes are apart there
        sizes = [pair(a, b) for a, b in combinations(paths[g], 2) if a in refs and b in refs]
        apart = max([x.spread[r] for x in sizes if r in x.spread] or [0.0])
        # and by as much as a change of size moves the loss of one state: the clean runs'
        # difference at their first step, before any update (dropout masks drawn per rank, a
        # global batch split otherwise), which a resume at another size adds once
        switch = max([x.spread[min(x.spread)] for x in sizes if x.spread] or [0.0])
        row = by_step[r]
        tol = row.tol if math.isfinite(row.tol) else 0.0
        before, after = run[p][1], run[r][1]
        if abs(after - before) > allowed + apart + switch + tol:
            jumps.append(_Jump(r, run[r][0], p, before, after, allowed, apart, switch, tol))

    details: dict[str, Any] = {
        "factor": SPREAD_FACTOR, "compared": sum(r.ref is not None for r in rows),
        "missing": gaps, "not_reached": tail,
        "deviations": {r.step: r.loss - r.ref for r in rows if r.ref is not None},
        "tolerances": {r.step: r.tol for r in rows if math.isfinite(r.tol)},
        "regimes": {r.step: r.why for r in rows},
        "references": [topology_name(t) for t in refs],
        "deterministic": exact, "jumps": [j.step for j in jumps],
        "divergence": {f"{topology_name(a.a)} vs {topology_name(a.b)}": a.diverged_at
                       for a in agreements.values()}}

    def dev_text(r: _Row) -> str:
        return (f"{r.loss:.6g} vs {r.ref:.6g} in the clean run at {topology_name(r.topology)} (off "
                f"by {r.dev:.3g}, {r.units:.3g}x the tolerance)")

    def tol_text(r: _Row) -> str:
        if r.why == "same":
            return (f"the run never left {topology_name(r.topology)} before this step, so it must "
                    f"match that clean run bit for bit (tolerance {SAME_SIZE_FLOOR:g}*|loss|, "
                    "ten float32 roundings)")
        names = " and ".join(topology_name(t) for t in paths[r.occ.gen])
        return (f"the run passed through {names}: tolerance {SPREAD_FACTOR:g}x the largest "
                f"difference between those clean runs up to step {r.step} ({r.tol / SPREAD_FACTOR:.3g})")

    def resume_of(occ: Occurrence) -> int | None:
        gen = gens.get(occ.gen)
        return gen.resume_step if gen and occ.gen != first_gen else None

    failing = [r for r in rows if r.status == "fail"]
    if failing or jumps:
        first_row = failing[0] if failing else None
        first_jump = jumps[0] if jumps else None
        if first_jump is not None and (first_row is None or first_jump.step < first_row.step):
            j = first_jump
            s, occ = j.step, j.occ
            text = (f"loss jumps at resume point step {s} (generation {occ.gen}, "
                    f"{topology_name(topo(occ.gen))}): from {j.before:.6g} at step {j.prev} to "
                    f"{j.after:.6g}, a move of {abs(j.after - j.before):.3g}; the clean runs never "
                    f"moved more than {j.allowed:.3g} in {j.step - j.prev} "
                    f"step{'s' if j.step - j.prev != 1 else ''}"
                    + (f", and are {j.apart:.3g} apart at this step across world sizes "
                       f"({j.switch:.3g} before any update)" if j.apart or j.switch else "")
                    + "; a resumed state that is not the saved one (model weights, optimizer "
                      "moments, LR schedule, data position or RNG) does this: see "
                      "state_equivalence")
        else:
            assert first_row is not None
            row = first_row
            s, occ = row.step, row.occ
            resume = resume_of(occ)
            if resume == s:
                text = f"loss spike at resume point step {s} (generation {occ.gen}): {dev_text(row)}"
            elif resume is not None:
                text = (f"loss departs from the reference at step {s} (generation {occ.gen}, "
                        f"{s - resume} step{'s' if s - resume != 1 else ''} after the resume at "
                        f"step {resume}): {dev_text(row)}")
            else:
                text = (f"loss departs from the reference at step {s} (generation {occ.gen}): "
                        f"{dev_text(row)}")
            worst = max(failing, key=lambda x: (x.units, -x.step))
            if worst.step != s:
                text += f"; worst at step {worst.step} (generation {worst.occ.gen}): {dev_text(worst)}"
            text += (f" ({tol_text(row)})" + ("" if resume is None else
                     "; a resumed state that differs from the saved one (optimizer moments, LR "
                     "schedule, data position or RNG) does this: see state_equivalence"))
            if jumps:
                j = jumps[0]
                text += (f"; the loss {'also ' if j.step != s else ''}jumps at resume point step "
                         f"{j.step} by {abs(j.after - j.before):.3g}, more than the clean runs "
                         f"ever moved in a step ({j.allowed:.3g})")
        return Verdict.failed(check, text, step=s, generation=occ.gen,
                              fault=_fault_before(history, occ.gen), details=details)
    if gaps:
        return Verdict.failed(check, f"no loss for kept steps {_ranges(gaps)} although the reference "
                              f"has them and the run went on to step {last}: they were skipped or "
                              "their loss was not recorded", step=gaps[0], details=details)

    summary = _summary(rows, paths, topo, resume_of, exact, window)
    unknown = [r for r in rows if r.status == "unknown"]
    if unknown:
        row = unknown[0]
        steps = _ranges(u.step for u in unknown if u.why == row.why)
        if row.why == "diverged":
            assert row.agreement is not None
            a = row.agreement
            what = "world size" if len(a.a) != len(a.b) else "topology"
            text = (f"training depends on the {what}: {a.describe()}, so steps {steps} of "
                    f"generations that crossed {what}s cannot be judged against a clean run "
                    f"(first: step {row.step}, {dev_text(row)}); hold the global batch and the "
                    "learning rate fixed across world sizes (and draw dropout per sample, not per "
                    "rank) to make the loss comparable, or rely on state_equivalence (digests of "
                    "the state loaded after the reshard)")
        elif row.why == "nondeterministic":
            w = max(window.values(), default=0.0)
            text = (f"the workload is not bit-exact at one world size: before any fault, "
                    f"generation {first_gen} differs from the clean run at "
                    f"{topology_name(first_topo)} by up to {w:.3g}, and steps {steps} differ "
                    f"from theirs by more than {SPREAD_FACTOR:g}x that (first: step {row.step}, "
                    f"{dev_text(row)}), which cannot be told from nondeterminism; make training "
                    "deterministic (torch.use_deterministic_algorithms, a fixed reduction order) "
                    "or rely on state_equivalence")
        else:
            missing = sorted({topology_name(p) for u in unknown if u.why == "noref"
                              for p in paths[u.occ.gen] + (u.topology,) if p not in refs})
            text = (f"no clean run at {', '.join(missing) or topology_name(row.topology)} to judge "
                    f"steps {steps} against: pass the clean run at every topology the run used")
        return Verdict.unknown(check, f"{text}; {summary}", step=row.step, generation=row.occ.gen,
                               details=details)
    if tail:
        return Verdict.unknown(check, f"the run stopped at step {last}: steps {_ranges(tail)} were "
                               f"never compared; {summary}", step=last + 1, details=details)
    return Verdict.passed(check, summary, details=details)


def _summary(rows: list[_Row], paths: Mapping[int, tuple[Topology, ...]], topo: Any,
             resume_of: Any, exact: bool, window: Mapping[int, float]) -> str:
    """Per generation: what it was judged against and how close it came."""
    parts = []
    for g in sorted(paths):
        mine = [r for r in rows if r.occ.gen == g and r.status == "ok"]
        if not mine:
            continue
        steps = _ranges(r.step for r in mine)
        where = f"generation {g} ({topology_name(topo(g))}, steps {steps}"
        resume = resume_of(mine[0].occ)
        if resume is not None:
            came = " after " + " and ".join(topology_name(t) for t in paths[g][:-1]) \
                if len(paths[g]) > 1 else ""
            where += f", resumed at step {resume}{came}"
        where += ")"
        if len(paths[g]) == 1 and exact:
            same = all(r.dev == 0 for r in mine)
            parts.append(f"{where}: " + ("identical to" if same else
                                         f"within {SAME_SIZE_FLOOR:g}*|loss| of")
                         + " the clean run at that size")
        elif len(paths[g]) == 1:
            parts.append(f"{where}: within {SPREAD_FACTOR:g}x the same-size nondeterminism "
                         f"measured before the first fault ({max(window.values(), default=0):.3g})")
        else:
            worst = max(mine, key=lambda r: r.units)
            after = [r for r in mine if r.agreement is not None]
            text = (f"{where}: within {SPREAD_FACTOR:g}x the per-step spread of the clean runs "
                    f"(worst {worst.units:.2g} of the tolerance at step {worst.step})")
            if after:
                a = after[0].agreement
                assert a is not None
                text += (f"; from step {a.diverged_at}, where the clean runs at "
                         f"{topology_name(a.a)} and {topology_name(a.b)} diverge, it tracks the "
                         f"clean run at its own size within the floor measured before")
            parts.append(text)
    return "; ".join(parts) if parts else "no step compared"


@register("loss_continuity", column="loss", assertion="assert_loss_continuous",
          description="each kept step's loss matches the clean run at its own topology: bit for "
                      "bit at one size, within 10x the clean runs' per-step spread across sizes "
                      "(unknown where training depends on the size); no jump at a resume")
def _check(ctx: CheckContext) -> Verdict:
    """Against one clean run per topology the run's kept steps came through; unknown, with the
    reason, when one of them cannot be had."""
    history = ctx.history
    kept = history.kept_losses()
    gens = history.generations
    topologies: list[Topology] = []
    for g in sorted({occ.gen for occ, _ in kept.values()} | ({min(gens)} if gens else set())):
        t = tuple(gens[g].roles) if g in gens and gens[g].roles else tuple(ctx.first_roles)
        if t and t not in topologies:
            topologies.append(t)
    if not topologies:
        topologies = [tuple(ctx.first_roles)]
    references: dict[Topology, History] = {}
    for t in topologies:
        clean = ctx.clean_reference(list(t))
        if clean.broken:
            return Verdict.unknown("loss_continuity", clean.broken)
        if clean.history is None:
            return loss_continuity(history)   # no clean runs to be had: unknown, with the reason
        references[t] = clean.history
    return loss_continuity(history, references=references)
