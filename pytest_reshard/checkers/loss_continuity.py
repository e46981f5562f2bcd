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
  ``unknown`` rather than fail. With no such steps, or in a heterogeneous world (whose clean run
  ran at even shares, so its steps are no repeat), a gloo run is taken as bit-exact, others not.
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
CHECK = "loss_continuity"


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
    why: str            # "same", "cross", "window", "nondeterministic", "diverged", "noref",
    #                     "nonfinite"
    agreement: Agreement | None = None

    @property
    def dev(self) -> float:
        return abs(self.loss - self.ref) if self.ref is not None and math.isfinite(self.loss) \
            else math.inf

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
    refs = _reference_losses(references, reference)
    if isinstance(refs, Verdict):
        return refs
    run = {s: (occ, loss) for s, (occ, loss) in history.kept_losses().items()}
    if not run:
        return Verdict.unknown(CHECK, "the run recorded no loss for any kept step; call "
                               "s.record(loss=loss.item()) in every step")
    case = _Case(history, refs, run, deterministic)
    rows = [case.row(s) for s in sorted(run)]
    jumps = case.jumps({r.step: r for r in rows})
    last = max(run)
    base = refs.get(case.first_topo) or next(iter(refs.values()))
    gaps = sorted(s for s in base if s not in run and s <= last)
    tail = sorted(s for s in base if s > last)
    details: dict[str, Any] = {
        "factor": SPREAD_FACTOR, "compared": sum(r.ref is not None for r in rows),
        "missing": gaps, "not_reached": tail,
        "deviations": {r.step: r.loss - r.ref for r in rows if r.ref is not None},
        "tolerances": {r.step: r.tol for r in rows if math.isfinite(r.tol)},
        "regimes": {r.step: r.why for r in rows},
        "references": [topology_name(t) for t in refs],
        "deterministic": case.exact, "jumps": [j.step for j in jumps],
        "divergence": {f"{topology_name(a.a)} vs {topology_name(a.b)}": a.diverged_at
                       for a in case.agreements.values()}}
    failing = [r for r in rows if r.status == "fail"]
    if failing or jumps:
        return case.failed(failing, jumps, details)
    if gaps:
        return Verdict.failed(CHECK, f"no loss for kept steps {_ranges(gaps)} although the reference "
                              f"has them and the run went on to step {last}: they were skipped or "
                              "their loss was not recorded", step=gaps[0], details=details)
    summary = _summary(rows, case)
    unknown = [r for r in rows if r.status == "unknown"]
    if unknown:
        return case.unknown(unknown, summary, details)
    if tail:
        return Verdict.unknown(CHECK, f"the run stopped at step {last}: steps {_ranges(tail)} were "
                               f"never compared; {summary}", step=last + 1, details=details)
    return Verdict.passed(CHECK, summary, details=details)


def _reference_losses(references: Iterable[History] | Mapping[Any, History],
                      reference: History | None) -> dict[Topology, dict[int, float]] | Verdict:
    """The clean runs' losses by topology, or why there are none to judge against."""
    given = [] if isinstance(references, Mapping) else list(references)
    if reference is not None:
        given.insert(0, reference)
    if not given and not (isinstance(references, Mapping) and references):
        return Verdict.unknown(CHECK, "no reference run to compare with: pass references=[History "
                               "of a fault-free run with the same seed and data order at each "
                               "world size the run used]")
    refs: dict[Topology, dict[int, float]] = {}
    if isinstance(references, Mapping):   # keyed by the roles they were asked for
        for key, h in references.items():
            refs.setdefault(tuple(key), _losses(h))
    for h in given:
        refs.setdefault(_topology_of(h), _losses(h))
    if not any(refs.values()) or any(not v for v in refs.values()):
        return Verdict.unknown(CHECK, "the reference run recorded no loss; call "
                               "s.record(loss=loss.item()) in every step")
    return refs


class _Case:
    """A run's kept losses with the clean runs they are judged against, and what follows from
    them: each generation's path of topologies, and whether one size is bit-exact."""

    def __init__(self, history: History, refs: dict[Topology, dict[int, float]],
                 run: dict[int, tuple[Occurrence, float]], deterministic: bool | None) -> None:
        self.history, self.refs, self.run = history, refs, run
        self.gens = history.generations
        self.first_gen = min(self.gens) if self.gens else min(occ.gen for occ, _ in run.values())
        self.owners = sorted({occ.gen for occ, _ in run.values()})
        self.paths: dict[int, tuple[Topology, ...]] = {}
        seen: list[Topology] = []
        for g in self.owners:
            here = list(seen) + ([self.topo(g)] if self.topo(g) not in seen else [])
            self.paths[g] = tuple(here)
            seen = here
        self.first_topo = self.topo(self.first_gen)
        self.agreements: dict[frozenset[Topology], Agreement] = {}

        # Generation 0 before its first fault is a repeat of the clean run at its topology.
        fault_steps = [f.step for f in history.faults_fired()]
        if history.scenario is not None:
            fault_steps += [int(f["step"]) for f in history.scenario.schedule.get("faults", [])
                            if isinstance(f.get("step"), int)]
        first_fault = min(fault_steps, default=math.inf)
        first_ref = refs.get(self.first_topo, {})
        self.window = {s: abs(loss - first_ref[s]) for s, (occ, loss) in run.items()
                       if occ.gen == self.first_gen and s < first_fault and s in first_ref}
        if self.window and not history.devices():
            self.exact = all(d <= ROUNDING_FLOOR * abs(first_ref[s])
                             for s, d in self.window.items())
        elif deterministic is not None:   # a device mix's window is not a repeat of the clean
            # run (that one ran at even shares): what differs there may be the mix's own bug
            self.exact = deterministic
        else:
            self.exact = (history.scenario.backend if history.scenario else "gloo") == "gloo"
        self._window_steps = sorted(self.window)
        self._window_running: list[float] = []
        for s in self._window_steps:
            self._window_running.append(max(self._window_running[-1] if self._window_running
                                            else 0.0, self.window[s]))

    def topo(self, gen: int) -> Topology:
        if gen in self.gens and self.gens[gen].roles:
            return tuple(self.gens[gen].roles)
        return next(iter(self.refs))  # a history without generation records: its only reference

    def pair(self, a: Topology, b: Topology) -> Agreement:
        key = frozenset((a, b))
        if key not in self.agreements:
            self.agreements[key] = agreement(a, self.refs[a], b, self.refs[b])
        return self.agreements[key]

    def resume_of(self, occ: Occurrence) -> int | None:
        gen = self.gens.get(occ.gen)
        return gen.resume_step if gen and occ.gen != self.first_gen else None

    def row(self, s: int) -> _Row:
        """Step ``s`` against the clean run at its topology, in the regime its path puts it."""
        occ, loss = self.run[s]
        t = self.topo(occ.gen)
        path = self.paths[occ.gen]
        ref = self.refs.get(t, {}).get(s)
        if ref is None or any(p not in self.refs for p in path):
            return _Row(s, occ, loss, ref, t, math.inf, "unknown", "noref")
        if not math.isfinite(loss):   # NaN compares false with any tolerance: fail it here
            return _Row(s, occ, loss, ref, t, 0.0, "fail", "nonfinite")
        rounding = max(ROUNDING_FLOOR * abs(ref), 1e-30)
        dev = abs(loss - ref)
        if len(path) == 1:
            if self.exact:
                tol = max(SAME_SIZE_FLOOR * abs(ref), 1e-30)
                return _Row(s, occ, loss, ref, t, tol, "fail" if dev > tol else "ok", "same")
            if occ.gen == self.first_gen and s in self.window:
                return _Row(s, occ, loss, ref, t, max(rounding, dev), "ok", "window")
            i = bisect.bisect_right(self._window_steps, s)
            noise = self._window_running[i - 1] if i else 0.0
            tol = max(SAME_SIZE_FLOOR * abs(ref), SPREAD_FACTOR * noise)
            return _Row(s, occ, loss, ref, t, tol, "unknown" if dev > tol else "ok",
                        "nondeterministic")
        pairs = [self.pair(a, b) for a, b in combinations(path, 2)]
        floor = max([rounding] + [p.floor_at(s) for p in pairs])
        tol = SPREAD_FACTOR * floor
        split = next((p for p in sorted(pairs, key=lambda p: p.diverged_at or 0)
                      if not p.agrees_at(s)), None)
        if dev <= tol:
            return _Row(s, occ, loss, ref, t, tol, "ok", "cross", split)
        if split is None:
            return _Row(s, occ, loss, ref, t, tol, "fail", "cross")
        return _Row(s, occ, loss, ref, t, tol, "unknown", "diverged", split)

    def jumps(self, by_step: Mapping[int, _Row]) -> list[_Jump]:
        """Resume points whose first loss moved further than the clean runs ever did."""
        jumps: list[_Jump] = []
        run, refs = self.run, self.refs
        for g in self.owners[1:]:
            r = min(s for s, (occ, _) in run.items() if occ.gen == g)
            earlier = [s for s in run if s < r]
            if not earlier:
                continue
            p = max(earlier)
            allowed = max(_largest_move(v, r - p) for v in refs.values())
            # where training depends on the world size, the loss at r may also be as far from the
            # previous size's as the clean runs at the two sizes are apart there
            sizes = [self.pair(a, b) for a, b in combinations(self.paths[g], 2)
                     if a in refs and b in refs]
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
        return jumps

    def dev_text(self, r: _Row) -> str:
        if r.why == "nonfinite":
            return (f"{r.loss} where the clean run at {topology_name(r.topology)} has "
                    f"{r.ref:.6g}")
        return (f"{r.loss:.6g} vs {r.ref:.6g} in the clean run at {topology_name(r.topology)} (off "
                f"by {r.dev:.3g}, {r.units:.3g}x the tolerance)")

    def tol_text(self, r: _Row) -> str:
        if r.why == "nonfinite":
            return "a loss that is not a finite number fails at any tolerance"
        if r.why == "same":
            return (f"the run never left {topology_name(r.topology)} before this step, so it must "
                    f"match that clean run bit for bit (tolerance {SAME_SIZE_FLOOR:g}*|loss|, "
                    "ten float32 roundings)")
        names = " and ".join(topology_name(t) for t in self.paths[r.occ.gen])
        return (f"the run passed through {names}: tolerance {SPREAD_FACTOR:g}x the largest "
                f"difference between those clean runs up to step {r.step} ({r.tol / SPREAD_FACTOR:.3g})")

    def failed(self, failing: list[_Row], jumps: list[_Jump], details: dict[str, Any]) -> Verdict:
        """The first failing step or resume jump, whichever came first, with the worst one."""
        first_row = failing[0] if failing else None
        first_jump = jumps[0] if jumps else None
        if first_jump is not None and (first_row is None or first_jump.step < first_row.step):
            j = first_jump
            s, occ = j.step, j.occ
            text = (f"loss jumps at resume point step {s} (generation {occ.gen}, "
                    f"{topology_name(self.topo(occ.gen))}): from {j.before:.6g} at step {j.prev} "
                    f"to {j.after:.6g}, a move of {abs(j.after - j.before):.3g}; the clean runs "
                    f"never moved more than {j.allowed:.3g} in {j.step - j.prev} "
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
            resume = self.resume_of(occ)
            if resume == s:
                text = (f"loss spike at resume point step {s} (generation {occ.gen}): "
                        f"{self.dev_text(row)}")
            elif resume is not None:
                text = (f"loss departs from the reference at step {s} (generation {occ.gen}, "
                        f"{s - resume} step{'s' if s - resume != 1 else ''} after the resume at "
                        f"step {resume}): {self.dev_text(row)}")
            else:
                text = (f"loss departs from the reference at step {s} (generation {occ.gen}): "
                        f"{self.dev_text(row)}")
            worst = max(failing, key=lambda x: (x.units, -x.step))
            if worst.step != s:
                text += (f"; worst at step {worst.step} (generation {worst.occ.gen}): "
                         f"{self.dev_text(worst)}")
            text += (f" ({self.tol_text(row)})" + ("" if resume is None else
                     "; a resumed state that differs from the saved one (optimizer moments, LR "
                     "schedule, data position or RNG) does this: see state_equivalence, and "
                     "one_step_checkpoint for a save that holds another step"))
            if jumps:
                j = jumps[0]
                text += (f"; the loss {'also ' if j.step != s else ''}jumps at resume point step "
                         f"{j.step} by {abs(j.after - j.before):.3g}, more than the clean runs "
                         f"ever moved in a step ({j.allowed:.3g})")
        return Verdict.failed(CHECK, text, step=s, generation=occ.gen,
                              fault=_fault_before(self.history, occ.gen), details=details)

    def unknown(self, unknown: list[_Row], summary: str, details: dict[str, Any]) -> Verdict:
        """Why the first steps that cannot be judged cannot be, and what to change."""
        row = unknown[0]
        steps = _ranges(u.step for u in unknown if u.why == row.why)
        if row.why == "diverged":
            assert row.agreement is not None
            a = row.agreement
            what = "world size" if len(a.a) != len(a.b) else "topology"
            text = (f"training depends on the {what}: {a.describe()}, so steps {steps} of "
                    f"generations that crossed {what}s cannot be judged against a clean run "
                    f"(first: step {row.step}, {self.dev_text(row)}); the loss is comparable "
                    f"across {what}s only where nothing depends on the {what}: the global batch, "
                    "the learning rate, dropout drawn per rank, the order the data loader deals "
                    "samples to ranks; rely on state_equivalence (digests of the state loaded "
                    "after the reshard) for the rest")
        elif row.why == "nondeterministic":
            w = max(self.window.values(), default=0.0)
            text = (f"the workload is not bit-exact at one world size: before any fault, "
                    f"generation {self.first_gen} differs from the clean run at "
                    f"{topology_name(self.first_topo)} by up to {w:.3g}, and steps {steps} differ "
                    f"from theirs by more than {SPREAD_FACTOR:g}x that (first: step {row.step}, "
                    f"{self.dev_text(row)}), which cannot be told from nondeterminism; make "
                    "training deterministic (torch.use_deterministic_algorithms, a fixed reduction "
                    "order) or rely on state_equivalence")
        else:
            missing = sorted({topology_name(p) for u in unknown if u.why == "noref"
                              for p in self.paths[u.occ.gen] + (u.topology,) if p not in self.refs})
            text = (f"no clean run at {', '.join(missing) or topology_name(row.topology)} to judge "
                    f"steps {steps} against: pass the clean run at every topology the run used")
        return Verdict.unknown(CHECK, f"{text}; {summary}", step=row.step, generation=row.occ.gen,
                               details=details)


def _summary(rows: list[_Row], case: _Case) -> str:
    """Per generation: what it was judged against and how close it came."""
    paths, exact, window = case.paths, case.exact, case.window
    parts = []
    for g in sorted(paths):
        mine = [r for r in rows if r.occ.gen == g and r.status == "ok"]
        if not mine:
            continue
        steps = _ranges(r.step for r in mine)
        where = f"generation {g} ({topology_name(case.topo(g))}, steps {steps}"
        resume = case.resume_of(mine[0].occ)
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


@register(CHECK, column="loss", assertion="assert_loss_continuous",
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
            return Verdict.unknown(CHECK, clean.broken)
        if clean.history is None:
            return loss_continuity(history)   # no clean runs to be had: unknown, with the reason
        references[t] = clean.history
    return loss_continuity(history, references=references)
