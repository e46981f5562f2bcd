"""exactly_once_samples: every (epoch, sample) of the kept steps is consumed once.

Counts ``(epoch, sample)`` per role over the kept occurrences (see ``History.kept``), so a target
and its drafter may both see a sample, but no two ranks of one role and no two steps may. The
epoch is what ``s.record(samples=..., epoch=...)`` recorded (0 when it was not). With a clean
reference run, a repeat the reference shows too is no duplicate (a workload that does not record
its epochs sees a sample again at the same step in the clean run: that is an epoch), and a
sample it consumed that the run never did is lost.

A pass says which steps it covered; a run that stopped before the reference's (or the
scenario's) last step is ``unknown`` about the rest, not a pass.
"""
from __future__ import annotations

from collections import Counter
from array import array
from typing import Any, Iterator

import numpy as np

from pytest_reshard.checkers._text import _advice, _fault_before, _ranges
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History, Occurrence
from pytest_reshard.verdict import Verdict

_Key = tuple[str, int, int]          # (role, epoch, sample)
_Use = tuple[Occurrence, int]        # (occurrence, rank)


def _at(occ: Occurrence, rank: int) -> str:
    return f"step {occ.step} (generation {occ.gen}, rank {rank})"


class _Seen:
    """One (role, epoch)'s distinct samples, sorted, each with the site of its first use: two
    arrays, not a dictionary (a thousand ranks' run consumes millions of samples)."""

    __slots__ = ("ids", "sites")

    def __init__(self, ids: Any, sites: Any) -> None:
        self.ids, self.sites = ids, sites

    def __len__(self) -> int:
        return len(self.ids)

    def site(self, x: int) -> int | None:
        """The site of ``x``'s first use; None where it was never used."""
        try:
            i = int(np.searchsorted(self.ids, x))
        except OverflowError:   # past int64: not among int64 ids
            return None
        return int(self.sites[i]) if i < len(self.ids) and self.ids[i] == x else None

    def missing_from(self, other: "_Seen | None") -> list[int]:
        """Its samples that ``other`` has not, in order."""
        if other is None:
            return [int(x) for x in self.ids]
        return [int(x) for x in np.setdiff1d(self.ids, other.ids, assume_unique=True)]


def _ids_array(ids: list[int]) -> Any:
    """Sample ids as int64, or as Python ints where one does not fit (sorted the same)."""
    try:
        return np.array(ids, dtype=np.int64)
    except OverflowError:
        return np.array(ids, dtype=object)


class _Uses:
    """Where the kept steps consumed each (role, epoch, sample). A run of a thousand ranks
    consumes millions of samples, nearly all once: a sample's first use is held as the index of
    the rank-step that drew it, and only a key used again gets the list of all its uses."""

    def __init__(self, history: History, kept: list[Occurrence]) -> None:
        self._occ = kept
        self._site_occ = array("I")    # a site (rank-step): its occurrence's index in kept
        self._site_rank = array("I")
        self.first: dict[tuple[str, int], _Seen] = {}   # (role, epoch) -> its samples' first uses
        self.again: dict[_Key, list[int]] = {}   # a key used more than once -> every use's site
        self.total = 0                           # uses in all
        roles: dict[tuple[int, int], str] = {}
        # (role, epoch) -> (ids, the site of each record's, how many ids each record drew)
        drawn_by: dict[tuple[str, int], tuple[list[int], list[int], list[int]]] = {}
        for site, (i, rank, drawn) in enumerate(history.drawn_in(kept)):
            gen = kept[i].gen
            role = roles.get((gen, rank))
            if role is None:
                role = roles[(gen, rank)] = history.role(gen, rank)
            self._site_occ.append(i)
            self._site_rank.append(rank)
            for epoch, ids in drawn:
                group = drawn_by.get((role, epoch))
                if group is None:
                    group = drawn_by[(role, epoch)] = ([], [], [])
                group[0].extend(ids)
                group[1].append(site)
                group[2].append(len(ids))
        again: list[tuple[tuple[int, int], _Key, list[int]]] = []   # (first site, order, ...)
        for (role, epoch), (ids, record_sites, counts) in drawn_by.items():
            self.total += len(ids)
            uses, sites = _ids_array(ids), np.repeat(np.array(record_sites, dtype=np.int64), counts)
            order = np.argsort(uses, kind="stable")   # equal ids in the order they were used
            ordered = uses[order]
            runs = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ordered) \
                else np.zeros(0, dtype=np.int64)
            self.first[(role, epoch)] = _Seen(ordered[runs], sites[order[runs]])
            sizes = np.diff(np.r_[runs, len(ordered)])
            for j in np.flatnonzero(sizes > 1).tolist():   # used again: every use, in order
                at = order[runs[j]:runs[j] + sizes[j]]
                where = sites[at].tolist()
                again.append(((where[0], int(at[0])), (role, epoch, int(ordered[runs[j]])), where))
        # in the order of each key's first use
        self.again = {key: where for _, key, where in sorted(again, key=lambda a: a[0])}

    def __len__(self) -> int:
        return sum(map(len, self.first.values()))

    def get(self, key: _Key) -> list[_Use]:
        """Its uses in order, a new tuple each (``_duplicates`` tells uses apart by identity)."""
        sites = self.again.get(key)
        if sites is None:
            seen = self.first.get(key[:2])
            site = None if seen is None else seen.site(key[2])
            sites = [] if site is None else [site]
        return [(self._occ[self._site_occ[i]], self._site_rank[i]) for i in sites]

    def count(self, key: _Key) -> int:
        sites = self.again.get(key)
        if sites is not None:
            return len(sites)
        seen = self.first.get(key[:2])
        return int(seen is not None and seen.site(key[2]) is not None)

    def repeated(self) -> Iterator[tuple[_Key, list[_Use]]]:
        return ((key, self.get(key)) for key in self.again)

    def consumed(self) -> int:
        """Distinct (epoch, sample) pairs, whichever role consumed them."""
        by_epoch: dict[int, list[_Seen]] = {}
        for (_, epoch), seen in self.first.items():
            by_epoch.setdefault(epoch, []).append(seen)
        return sum(len(ds[0]) if len(ds) == 1 else len(np.unique(np.concatenate([d.ids for d in ds])))
                   for ds in by_epoch.values())

    def roles(self) -> set[str]:
        return {role for role, _ in self.first}


class _RefSteps:
    """(role, epoch, sample) -> at which steps the reference consumed it, how often; counted
    only for the keys asked (the repeats), not for every sample of the run."""

    def __init__(self, ref_uses: _Uses) -> None:
        self._uses = ref_uses

    def get(self, key: _Key, default: Counter[int]) -> Counter[int]:
        where = self._uses.get(key)
        return Counter(o.step for o, _ in where) if where else default


def _duplicates(uses: _Uses, ref_steps: _RefSteps | None) -> list[tuple[_Key, _Use, _Use, int]]:
    """(key, an earlier use, the repeat, how many the reference allows) for each key consumed
    more often than it may be: once without a reference; with one, a repeat at a step where the
    reference consumed it too is allowed (an epoch the workload did not record)."""
    dups = []
    for key, where in uses.repeated():
        if ref_steps is None:
            dups.append((key, where[0], where[1], 1))
            continue
        allowed = ref_steps.get(key, Counter())
        limit = max(1, sum(allowed.values()))
        per_step = Counter(u[0].step for u in where)
        if len(where) <= limit and all(n <= max(1, allowed[s]) for s, n in per_step.items()):
            continue
        left = Counter(allowed)
        extra = []
        for use in where:
            if left[use[0].step] > 0:
                left[use[0].step] -= 1
            else:
                extra.append(use)
        again = next((u for u in extra if u is not where[0]), where[-1])
        first = where[where.index(again) - 1]
        dups.append((key, first, again, limit))
    dups.sort(key=lambda d: (d[2][0].gen, d[2][0].step, d[0][2]))
    return dups


def exactly_once_samples(history: History, *, reference: History | None = None) -> Verdict:
    """Every (epoch, sample) of the kept steps is consumed once (or as often as in the clean
    reference run, at the same steps); with a reference, none is lost."""
    check = "exactly_once_samples"
    never = history.never_started()
    if never is not None:
        return Verdict.unknown(check, never)
    kept = history.kept()
    if not history.has_samples():
        if not kept:
            return Verdict.unknown(check, "no step completed on every rank (nothing was kept), "
                                   "so no sample consumption to check (see liveness)")
        return Verdict.unknown(check, f"the {len(kept)} kept steps recorded no sample ids; "
                               + (_advice(history, check) or "call s.record(samples=batch_ids) "
                                  "as soon as the batch is drawn"))
    uses = _Uses(history, kept)
    last = max((o.step for o in kept), default=-1)
    covered = sorted({o.step for o in kept})
    ref_uses: _Uses | None = None
    ref_steps: _RefSteps | None = None
    if reference is not None:
        ref_kept = [o for o in sorted(reference.kept()) if o.step <= last]
        ref_uses = _Uses(reference, ref_kept)
        ref_steps = _RefSteps(ref_uses)
    dups = _duplicates(uses, ref_steps)
    consumed = uses.consumed()
    details: dict[str, Any] = {"kept_steps": len(kept), "samples": consumed,
                               "duplicates": len(dups), "steps_covered": _ranges(covered)}
    if dups:
        (role, epoch, sample), (o1, r1), (o2, r2), allowed = dups[0]
        if o1 == o2:
            why = "two ranks of one step drew it: the sampler's rank or world size is wrong"
        elif o1.gen != o2.gen:
            why = ("the data position was not restored across the generation change, or the new "
                   "world size re-split samples already consumed")
        else:
            why = "the data loader repeated it within one generation"
        again = "again at" if o1 != o2 else "at"
        n = uses.count((role, epoch, sample))
        times = "twice" if n == 2 else f"{n} times"
        ref = (f" (the clean reference run consumed it {allowed} time{'s' if allowed > 1 else ''}"
               f" by step {last})" if reference is not None else "")
        text = (f"sample {sample} (epoch {epoch}) consumed {times}{ref}: at {_at(o1, r1)} and "
                f"{again} {_at(o2, r2)}; {why}")
        if len(dups) > 1:
            text += f" ({len(dups)} duplicates in all)"
        details["first_duplicates"] = [
            {"sample": k[2], "epoch": k[1], "role": k[0], "first": [a.step, a.gen, ra],
             "again": [b.step, b.gen, rb]} for k, (a, ra), (b, rb), _ in dups[:20]]
        return Verdict.failed(check, text, step=o2.step, rank=r2, generation=o2.gen,
                              fault=_fault_before(history, o2.gen) if o2.gen != o1.gen else None,
                              details=details)
    over = f"over {len(kept)} kept steps (steps {_ranges(covered)})"
    total = uses.total
    once = f"{consumed} samples consumed exactly once {over}"
    if total > len(uses):   # repeats the clean run shows at the same steps: unrecorded epochs
        once = (f"{consumed} sample ids consumed {over}, each as often as in the clean run "
                f"and at the same steps ({total} consumptions: the ids repeat every epoch; "
                "record epoch= to count epochs apart)")
    if reference is None or ref_uses is None:
        return _coverage(history, check, f"{once} (no reference: lost samples not checked)",
                         last, None, details)
    # Per role: in a pipeline a sample its targets made but no drafter trained on is lost.
    # A sample is lost when the run consumed it fewer times than the reference did by the same
    # step (with unrecorded epochs, a sample dropped in one epoch is still seen in another).
    expected: dict[_Key, int] = {}   # key -> the reference step of its first unmatched use
    # Only a key the run consumed less often than the reference can be lost: one it never
    # consumed, or one the reference consumed more than once.
    candidates = [(role, epoch, x) for (role, epoch), ref_seen in ref_uses.first.items()
                  for x in ref_seen.missing_from(uses.first.get((role, epoch)))]
    for k in [*candidates, *ref_uses.again]:
        in_ref, mine = ref_uses.get(k), uses.get(k)
        left = Counter(o.step for o, _ in mine)
        unmatched = []
        for o, _ in in_ref:
            if left[o.step] > 0:
                left[o.step] -= 1
            else:
                unmatched.append(o.step)
        if len(in_ref) > len(mine):
            expected[k] = min(unmatched) if unmatched else in_ref[-1][0].step
    lost = sorted(expected, key=lambda k: (expected[k], k))
    unsure = _maybe_trained(history)
    if lost and unsure and all((k[1], k[2]) in unsure for k in lost):
        return Verdict.unknown(
            check, f"{len(lost)} samples the reference consumed were not consumed by an attempt "
            f"that ended, but every one of them was drawn by an attempt that died after its "
            f"backward (first: sample {lost[0][2]}, {unsure[(lost[0][1], lost[0][2])]}): its "
            "gradient may have reached the quorum's update, so whether they were trained cannot "
            "be told from the history", details={**details, "lost": len(lost)})
    lost = [k for k in lost if (k[1], k[2]) not in unsure]
    details["lost"] = len(lost)
    details["not_in_reference"] = sum(   # a data-order change, not a loss
        len(seen.missing_from(ref_uses.first.get(group))) for group, seen in uses.first.items())
    if lost:
        drawn: dict[tuple[int, int], Occurrence] = {}
        kept_set = set(kept)
        for occ, e in history.records():
            if occ not in kept_set:
                for s in e.get("samples") or ():
                    drawn.setdefault((int(e.get("epoch", 0) or 0), int(s)), occ)
        role, epoch, sample = lost[0]
        where = drawn.get((epoch, sample))
        fate = (f"; it was drawn at step {where.step} in generation {where.gen}, whose effect was "
                "discarded" if where else "; no kept or discarded step drew it")
        advice = ("restore the data position saved with the checkpoint"
                  + (", and give a lost rank's share to the survivors" if len(
                      ref_uses.roles()) > 1 else ""))
        reduced = sorted(history.reduced_steps())
        if reduced and expected[lost[0]] in reduced:
            # membership mode: a group was down and the quorum trained on without its share
            fate = (f"; steps {_ranges(reduced)} were committed by a quorum of fewer replica "
                    "groups, and no group trained the missing groups' samples of those steps")
            advice = ("a fault-tolerant trainer that lets a quorum train on without a group "
                      "drops that group's share of each such step unless it reassigns it")
        by = f" by a {role} rank" if len(ref_uses.roles()) > 1 else ""
        n_run, n_ref = uses.count(lost[0]), ref_uses.count(lost[0])
        how = ("were never consumed" if n_run == 0 else
               f"were consumed fewer times than in the reference ({n_run} of {n_ref} for the "
               "first; its ids repeat every epoch, so a pass that skipped it shows only in the "
               "count)")
        text = (f"{len(lost)} samples the reference consumed by step {last} {how}"
                f"{by}: first sample {sample} (epoch {epoch}), reference step "
                f"{expected[lost[0]]}{fate}; {advice}")
        details["lost_samples"] = [[r_, e_, s_] for r_, e_, s_ in lost[:50]]
        gen = where.gen if where else None
        return Verdict.failed(check, text, step=expected[lost[0]], generation=gen,
                              details=details)
    return _coverage(history, check, f"{once}, none of the reference's lost", last, reference,
                     details)


def _maybe_trained(history: History) -> dict[tuple[int, int], str]:
    """Membership mode: (epoch, sample) -> where, for the samples of attempts that never ended
    but got past their backward (the all-reduce may have carried their gradient into the
    quorum's committed update of that step)."""
    if history.replica_groups is None:
        return {}
    out = {}
    for g in history.generations:
        committed = history.committed(g)
        for a in history.attempts(g):
            if not a.ended and a.step in committed and \
                    a.phase not in ("begin", "forward", "backward"):
                for pair in a.samples:
                    out[pair] = (f"step {a.step} on rank {a.rank} (generation {g}), which died "
                                 f"at its {a.phase} point")
    return out


def _coverage(history: History, check: str, summary: str, last: int, reference: History | None,
              details: dict[str, Any]) -> Verdict:
    """Pass when the kept steps reach the end (the reference's last step, else the scenario's);
    ``unknown`` about the steps a run that stopped early never ran."""
    ends = [o.step for o in reference.kept()] if reference is not None else []
    end = max(ends) if ends else (history.scenario.steps - 1 if history.scenario else None)
    if end is not None and last < end:
        details["not_reached"] = _ranges(range(last + 1, end + 1))
        return Verdict.unknown(check, f"the run stopped at step {last}: the samples of steps "
                               f"{_ranges(range(last + 1, end + 1))} were never checked; "
                               f"{summary}", step=last + 1, details=details)
    return Verdict.passed(check, summary, details=details)


@register("exactly_once_samples", column="samples", assertion="assert_exactly_once",
          description="every sample is consumed exactly once across generations, and none the "
                      "clean run consumed is lost")
def _check(ctx: CheckContext) -> Verdict:
    """Against the session's clean run at the first topology; unknown, with the reason, when a
    clean run did not finish (or the run never started, so none was run)."""
    reference, broken = ctx.clean_first()
    if broken:
        return Verdict.unknown("exactly_once_samples", broken)
    return exactly_once_samples(ctx.history, reference=reference)
