"""exactly_once_samples: every (epoch, sample) of the kept steps is consumed once.

Counts ``(epoch, sample)`` per role over the kept occurrences (see ``History.kept``), so a target
and its drafter may both see a sample, but no two ranks of one role and no two steps may. With a
clean reference run, a sample it consumed that the run never did is lost.
"""
from __future__ import annotations

from typing import Any

from pytest_reshard.checkers._text import _fault_before
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History, Occurrence
from pytest_reshard.verdict import Verdict


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


@register("exactly_once_samples", column="samples", assertion="assert_exactly_once",
          description="every sample is consumed exactly once across generations, and none the "
                      "clean run consumed is lost")
def _check(ctx: CheckContext) -> Verdict:
    """Against the session's clean run at the first topology; unknown, with the reason, when a
    clean run did not finish."""
    clean = ctx.clean_runs()
    if clean.broken:
        return Verdict.unknown("exactly_once_samples", clean.broken)
    return exactly_once_samples(ctx.history, reference=clean.reference)
