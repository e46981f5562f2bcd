"""sample_ledger (pipelines): what the consumer role took is what the producer role made.

In every kept step the consumer ranks took exactly the samples the producer ranks made for that
step, so a dropped share or a batch delivered twice is named.
"""
from __future__ import annotations

from collections import Counter

from pytest_reshard.checkers._text import _count, _fault_before
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History, Occurrence
from pytest_reshard.verdict import Verdict

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
    check = "sample_ledger"
    if not has_roles(history, producer, consumer):
        return Verdict.unknown(check, f"no generation has both {producer!r} and {consumer!r} "
                               "ranks; the ledger checks a pipeline between those roles")
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
                              fault=_fault_before(history, occ.gen), details=details)
    return Verdict.passed(check, f"{delivered} samples crossed from {producer} to {consumer} "
                          f"ranks exactly as made, over {len(history.kept())} kept steps",
                          details=details)


@register("sample_ledger", column="ledger", assertion="assert_sample_ledger",
          applies=lambda ctx: ctx.has_roles(*PIPELINE_ROLES),
          when="the run has both target and drafter ranks (a pipeline), or the workload opts "
               "into it",
          description="across a pipeline's queue, every step's consumers took exactly what its "
                      "producers made")
def _check(ctx: CheckContext) -> Verdict:
    return sample_ledger(ctx.history)
